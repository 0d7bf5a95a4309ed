"""The probe `laminar serve` asks its Spark Connect server with (deploy/connect_probe.py): a question with a deadline,
and when a server counts as hung. The real server hung with SIGSTOP under `laminar serve`: test_serve_recovery.py."""

from __future__ import annotations

import socket
import threading
import time

from laminar_assets.deploy.connect_probe import ConnectProbe, ask_version, channel_to
from tests.deploy.processes import free_port, wait_for


def scripted(answers: list[str | None]):
    """An `ask` that answers from `answers` (None: answered), then always answers."""
    asked: list[float] = []

    def ask(url: str, timeout: float) -> str | None:
        asked.append(timeout)
        return answers.pop(0) if answers else None

    return ask, asked


def test_a_server_is_hung_after_three_unanswered_questions_in_a_row():
    ask, asked = scripted(["no answer within 0.05 s", "no answer", None, "UNAVAILABLE: a", "UNAVAILABLE: b",
                           "no answer: c"])
    probe = ConnectProbe("sc://127.0.0.1:1", every=0.05, ask=ask)
    try:
        wait_for(probe.hung.is_set, 10, "the probe to find the server hung")
        assert len(asked) == 6 and set(asked) == {0.05}  # the answer in between started the count again
        assert probe.why == "no answer: c" and probe.silent_seconds() > 0
    finally:
        probe.stop()


def test_a_server_that_answers_is_never_hung():
    ask, asked = scripted([None] * 20 + ["UNAVAILABLE: once"] * 2)
    probe = ConnectProbe("sc://127.0.0.1:1", every=0.02, ask=ask)
    try:
        wait_for(lambda: len(asked) >= 40, 10, "forty questions")
        assert not probe.hung.is_set() and probe.silent_seconds() == 0
    finally:
        probe.stop()


def test_the_question_is_bounded_by_its_deadline_on_a_server_that_accepts_and_never_answers():
    """What a stopped JVM looks like from outside: its port accepts connections (the kernel's backlog) and nothing
    answers. The question gives up at its deadline; on a port where nothing listens it fails at once."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    accepting.start()
    channel = channel_to(f"sc://127.0.0.1:{listener.getsockname()[1]}")
    try:
        started = time.monotonic()
        assert ask_version(channel, 1.0) == "no answer within 1 s"
        assert time.monotonic() - started < 5
    finally:
        channel.close()
        for s in held:
            s.close()
        listener.close()
    with channel_to(f"sc://127.0.0.1:{free_port()}") as channel:
        failure = ask_version(channel, 5.0)
    assert failure is not None and failure.startswith("UNAVAILABLE"), failure


def test_questions_start_every_interval_whatever_their_answers_take():
    """A question that waits out its deadline does not push the next one a whole interval further (the default took
    123 s to find a hang it should find in 30-40)."""
    starts: list[float] = []

    def slow(_, timeout: float) -> str:
        starts.append(time.monotonic())
        time.sleep(timeout)
        return "no answer"

    probe = ConnectProbe("sc://127.0.0.1:1", every=1.0, ask=slow)
    try:
        wait_for(probe.hung.is_set, 20, "the probe to find the server hung")
    finally:
        probe.stop()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 3 and all(0.9 < g < 1.6 for g in gaps), gaps  # a wait after each answer: 2 s
