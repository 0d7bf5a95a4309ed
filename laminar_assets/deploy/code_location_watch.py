"""`laminar serve` keeps its code locations answering: a code server that died is restarted, not left dead.

`dagster dev` serves each code location through a proxy (`dagster code-server start`) that runs the user
code in a child process (`dagster api grpc`). When the proxy dies, `dagster dev` starts a new one; when only
the child dies (killed, out of memory), nothing does: the location shows "Could not reach user code server",
every sensor tick fails, and no run starts until someone presses Reload in the UI. The watch does what that
button does, through the webserver's GraphQL API: it asks for the locations' state every few seconds and,
when one has been unreachable on two looks in a row, reloads it (the proxy then starts a new child). A
reload that does not bring it back is retried with a doubling pause up to a minute; a location that loads
with an error of the user's code (a syntax error, a bad spec) is reported once and left for the user to fix,
since no restart cures it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

# the error class on the first line of Dagster's message for a location it cannot reach
UNREACHABLE = "DagsterUserCodeUnreachableError"
LOOK_EVERY_SECONDS = 2.0
FIRST_RETRY_SECONDS = 5.0
LONGEST_RETRY_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 10.0

_STATES = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message errorChain { error { message } } } } } } } }"""
_RELOAD = """mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { locationOrLoadError { __typename ... on PythonError { message
  errorChain { error { message } } } } } ... on PythonError { message } } }"""

# what GraphQL answered: variables in, the response's "data" out
Query = Callable[[str, dict], dict]


def graphql(ui_url: str, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> Query:
    """A query function against the webserver at `ui_url` (its /graphql endpoint)."""

    def query(text: str, variables: dict) -> dict:
        body = json.dumps({"query": text, "variables": variables}).encode()
        request = urllib.request.Request(f"{ui_url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        if answer.get("errors"):
            raise ValueError(f"GraphQL errors from {ui_url}: {answer['errors']}")
        return answer["data"]

    return query


@dataclass
class _Location:
    unreachable_looks: int = 0
    reloads: int = 0
    next_reload_at: float = 0.0
    reported_error: str | None = None


@dataclass
class CodeLocationWatch:
    """Looks at the code locations (`look()`, every LOOK_EVERY_SECONDS from `laminar serve`'s loop) and reloads
    one that stopped answering. `say` gets one line per event (a restart, a recovery, a load error)."""

    query: Query
    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    _locations: dict[str, _Location] = field(default_factory=dict)
    _next_look_at: float = 0.0

    def due(self) -> bool:
        return self.clock() >= self._next_look_at

    def look(self) -> None:
        """One look at every location; reloads the ones unreachable for two looks. A webserver that does not
        answer (busy, restarting) is no news: the next look asks again."""
        self._next_look_at = self.clock() + LOOK_EVERY_SECONDS
        try:
            data = self.query(_STATES, {})
        except (OSError, ValueError, KeyError):  # URLError and timeouts are OSErrors; a bad answer: ask again
            return
        workspace = data.get("workspaceOrError") or {}
        for entry in workspace.get("locationEntries") or []:
            self._consider(entry["name"], _error_of(entry))

    def _consider(self, name: str, error: str | None) -> None:
        state = self._locations.setdefault(name, _Location())
        if error is None:
            if state.reloads or state.reported_error:
                self.say(f"code location '{name}' loads again")
            self._locations[name] = _Location()
            return
        if not _unreachable(error):
            if error != state.reported_error:  # the user's code: a restart does not cure it
                self.say(f"code location '{name}' does not load: {_one_line(error)}; fix it and press Reload in "
                         "the UI (Deployment > Code locations)")
                state.reported_error = error
            state.unreachable_looks = state.reloads = 0
            return
        state.unreachable_looks += 1
        if state.unreachable_looks < 2 or self.clock() < state.next_reload_at:
            return
        self._reload(name, state)

    def _reload(self, name: str, state: _Location) -> None:
        pause = min(LONGEST_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2 ** state.reloads)
        state.reloads += 1
        state.next_reload_at = self.clock() + pause
        self.say(f"code location '{name}': its code server stopped answering; restarting it (reload "
                 f"{state.reloads}; next try in {pause:.0f} s if it does not answer)")
        try:
            answer = self.query(_RELOAD, {"name": name})["reloadRepositoryLocation"]
        except (OSError, ValueError, KeyError) as exc:
            self.say(f"code location '{name}': the reload did not go through ({exc}); trying again in {pause:.0f} s")
            return
        error = _error_of(answer) if answer.get("__typename") == "WorkspaceLocationEntry" else answer.get("message")
        if error is None:
            self._consider(name, None)
        elif not _unreachable(error):
            self._consider(name, error)


def _error_of(entry: dict) -> str | None:
    """The message of a location entry's load error, then the messages of the errors it came from (where the
    user's mistake is: a SyntaxError and its file and line, a setting that is no setting); None when it loaded."""
    loaded = entry.get("locationOrLoadError") or {}
    if loaded.get("__typename") != "PythonError":
        return None
    messages = [str(loaded.get("message") or "").strip()]
    messages += [str((link.get("error") or {}).get("message") or "").strip() for link in loaded.get("errorChain") or []]
    return " <- ".join(m for m in messages if m) or "PythonError"


def _one_line(message: str, limit: int = 600) -> str:
    """A message on one line (Dagster's span several), at most `limit` characters."""
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _unreachable(message: str) -> bool:
    return UNREACHABLE in _first_line(message)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message
