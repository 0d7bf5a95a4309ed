"""The watch's decisions, one GraphQL answer at a time: when it reloads a code location, how often, and what it
says. The real thing, a code server killed under `laminar serve` and brought back, is in test_serve_recovery.py."""

from __future__ import annotations

import pytest

from laminar_assets.deploy.code_location_watch import (
    FIRST_RETRY_SECONDS,
    LONGEST_RETRY_SECONDS,
    LOOK_EVERY_SECONDS,
    CodeLocationWatch,
)

UNREACHABLE = ("dagster._core.errors.DagsterUserCodeUnreachableError: Could not reach user code server. "
               "gRPC Error code: UNKNOWN\n")
BROKEN = "dagster._core.errors.DagsterImportError: Encountered ImportError: `No module named 'nothing'`\n  at ..."


CUT_SHORT = ("dagster._core.errors.DagsterUserCodeLoadError: Error occurred during the loading of Dagster definitions "
             "in\nexecutable_path=/venv/bin/python, module_name=laminar_assets.definitions\n")
SYNTAX = "SyntaxError: invalid syntax (ohlc_5m.py, line 23)\n"


def _entry(error: str | None, chain: tuple[str, ...] = ()) -> dict:
    loaded = {"__typename": "PythonError", "message": error,
              "errorChain": [{"error": {"message": m}} for m in chain]} if error else {"__typename": "RepositoryLocation"}
    return {"name": "laminar", "loadStatus": "LOADED", "locationOrLoadError": loaded}


class Webserver:
    """Answers the watch's two requests from `states` (the location's error at each look) and counts reloads;
    a reload answers with `after_reload`'s next state."""

    def __init__(self, states: list[str | None], after_reload: list[str | None] | None = None):
        self.states, self.after_reload, self.reloads = list(states), list(after_reload or []), 0

    def __call__(self, text: str, variables: dict) -> dict:
        if text.lstrip().startswith("mutation"):
            self.reloads += 1
            return {"reloadRepositoryLocation": {"__typename": "WorkspaceLocationEntry",
                                                 **_answer(self.after_reload.pop(0))}}
        return {"workspaceOrError": {"__typename": "Workspace", "locationEntries": [_answer(self.states.pop(0))]}}


def _answer(state) -> dict:
    """A state is an error message, None (loaded) or (message, chain)."""
    return _entry(*state) if isinstance(state, tuple) else _entry(state)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _looks(watch: CodeLocationWatch, clock: Clock, n: int) -> None:
    for _ in range(n):
        assert watch.due()
        watch.look()
        assert not watch.due()
        clock.now += LOOK_EVERY_SECONDS


def test_a_location_unreachable_on_two_looks_is_reloaded_once_and_its_return_is_told():
    server, clock, said = Webserver([None, UNREACHABLE, UNREACHABLE, None]), Clock(), []
    watch = CodeLocationWatch(server, said.append, clock=clock)
    _looks(watch, clock, 2)
    assert server.reloads == 0 and said == []  # one look is not enough: a busy server may miss one
    server.after_reload = [None]
    _looks(watch, clock, 2)
    assert server.reloads == 1
    assert said == ["code location 'laminar': its code server stopped answering; restarting it (reload 1; next try "
                    f"in {FIRST_RETRY_SECONDS:.0f} s if it does not answer)", "code location 'laminar' loads again"]


def test_reloads_that_do_not_bring_it_back_pause_longer_each_time_up_to_a_minute():
    looks = 400
    server, clock, said = Webserver([UNREACHABLE] * looks, [UNREACHABLE] * looks), Clock(), []
    watch = CodeLocationWatch(server, said.append, clock=clock)
    reload_times = []
    for _ in range(looks):
        before = server.reloads
        _looks(watch, clock, 1)
        if server.reloads > before:
            reload_times.append(clock.now)
    pauses = [b - a for a, b in zip(reload_times, reload_times[1:])]
    expected = [min(LONGEST_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** i) for i in range(len(pauses))]
    # a look every LOOK_EVERY_SECONDS: each pause rounds up to the next look
    assert all(p - LOOK_EVERY_SECONDS <= want <= p for p, want in zip(pauses, expected)), (pauses, expected)
    assert max(pauses) <= LONGEST_RETRY_SECONDS + LOOK_EVERY_SECONDS and len(reload_times) >= 10
    assert all("stopped answering" in line for line in said)


def test_a_location_whose_code_does_not_load_is_reported_once_and_not_reloaded():
    server, clock, said = Webserver([BROKEN] * 5 + [None]), Clock(), []
    watch = CodeLocationWatch(server, said.append, clock=clock)
    _looks(watch, clock, 6)
    assert server.reloads == 0
    assert said == ["code location 'laminar' does not load: dagster._core.errors.DagsterImportError: Encountered "
                    "ImportError: `No module named 'nothing'` at ...; fix it and press Reload in the UI (Deployment > "
                    "Code locations)", "code location 'laminar' loads again"]


def test_a_load_error_is_told_with_the_errors_it_came_from_on_one_line():
    """Dagster's message alone was cut at its first line ('... definitions in') and hid the user's mistake."""
    server, clock, said = Webserver([(CUT_SHORT, (SYNTAX,))] * 2), Clock(), []
    _looks(CodeLocationWatch(server, said.append, clock=clock), clock, 2)
    assert said == ["code location 'laminar' does not load: dagster._core.errors.DagsterUserCodeLoadError: Error "
                    "occurred during the loading of Dagster definitions in executable_path=/venv/bin/python, "
                    "module_name=laminar_assets.definitions <- SyntaxError: invalid syntax (ohlc_5m.py, line 23); fix "
                    "it and press Reload in the UI (Deployment > Code locations)"]


def test_the_reload_count_starts_again_after_the_users_code_was_reported():
    states = [UNREACHABLE, UNREACHABLE, BROKEN, UNREACHABLE, UNREACHABLE, None]
    server, clock, said = Webserver(states, [UNREACHABLE, None]), Clock(), []
    _looks(CodeLocationWatch(server, said.append, clock=clock), clock, len(states))
    assert [line for line in said if "restarting" in line] == [
        f"code location 'laminar': its code server stopped answering; restarting it (reload 1; next try in "
        f"{FIRST_RETRY_SECONDS:.0f} s if it does not answer)"] * 2


def test_a_reload_that_finds_the_users_code_broken_says_so_and_stops_reloading():
    server, clock, said = Webserver([UNREACHABLE, UNREACHABLE] + [BROKEN] * 10, [BROKEN]), Clock(), []
    watch = CodeLocationWatch(server, said.append, clock=clock)
    _looks(watch, clock, 12)
    assert server.reloads == 1
    assert [line.split(":")[0] for line in said] == ["code location 'laminar'", "code location 'laminar' does not load"]


@pytest.mark.parametrize("failure", [OSError("connection refused"), TimeoutError("timed out"), KeyError("data")])
def test_a_webserver_that_does_not_answer_is_asked_again_at_the_next_look(failure):
    said, clock, calls = [], Clock(), []

    def query(text, variables):
        calls.append(text)
        raise failure

    watch = CodeLocationWatch(query, said.append, clock=clock)
    _looks(watch, clock, 3)
    assert len(calls) == 3 and said == []


def test_an_unknown_error_is_not_swallowed():
    def query(text, variables):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        CodeLocationWatch(query, [].append).look()
