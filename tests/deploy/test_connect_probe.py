"""The probe `laminar serve` asks its Spark Connect server with (deploy/connect_probe.py): a question with a deadline,
and when a server counts as hung. The real server hung with SIGSTOP under `laminar serve`: test_serve_recovery.py."""

from __future__ import annotations

import socket
import threading
import time

from laminar_assets.deploy.connect_probe import ConnectProbe, ask_version
from tests.deploy.processes import free_port, wait_for


def scripted(answers: list[str | None]):
    """An `ask` that answers from `answers` (None: answered), then always answers."""
    asked: list[float] = []

    def ask(url: str, timeout: float) -> str | None:
        asked.append(timeout)
        return answers.pop(0) if answers else None

    return ask, asked


def test_a_server_is_hung_after_three_unanswered_questions_in_a_row():
    ask, asked = scripted(["DEADLINE_EXCEEDED: x", "DEADLINE_EXCEEDED: y", None, "UNAVAILABLE: a", "UNAVAILABLE: b",
                           "DEADLINE_EXCEEDED: c"])
    probe = ConnectProbe("sc://127.0.0.1:1", every=0.05, ask=ask)
    try:
        wait_for(probe.hung.is_set, 10, "the probe to find the server hung")
        assert len(asked) == 6 and set(asked) == {0.05}  # the answer in between started the count again
        assert probe.why == "DEADLINE_EXCEEDED: c" and probe.silent_seconds() > 0
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
    try:
        started = time.monotonic()
        failure = ask_version(f"sc://127.0.0.1:{listener.getsockname()[1]}", 1.0)
        assert failure is not None and failure.startswith("DEADLINE_EXCEEDED"), failure
        assert time.monotonic() - started < 5
    finally:
        for s in held:
            s.close()
        listener.close()
    failure = ask_version(f"sc://127.0.0.1:{free_port()}", 5.0)
    assert failure is not None and failure.startswith("UNAVAILABLE"), failure
