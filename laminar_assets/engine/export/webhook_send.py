"""Sending a webhook export's requests (urllib3: kept-alive connections, no retries of its own), with every
wait bounded:

- at most `max_in_flight` requests wait for an answer at once (one connection each), and at most
  `max_rows_per_second` rows go out a second (the requests are paced, not burst);
- a request waits `timeout_seconds` to connect and as long for each read of the answer;
- a 5xx, 408 or 429 answer, a timeout, a refused or dropped connection is tried again, `backoff_seconds` later,
  doubling up to `max_backoff_seconds` (a `Retry-After` of a 429/503 is taken within that bound), until
  `max_attempts`; any other answer (2xx: sent; another 4xx, 3xx: refused, not retried) is final;
- nothing starts, and no retry waits, past the delivery's deadline (`max_seconds` after it began): what is not
  done then stays pending.

Three requests in a row that used every attempt without any answer (timeouts, refused or dropped connections)
stop the delivery, and they stay pending instead of going to the dead letters: the receiver is unreachable
(it never answered in this delivery: the delivery fails) or stopped answering (a restart, an outage: the
delivery keeps what it did). A request without an answer among answered ones (a row the receiver chokes on)
fails alone, to the dead letters.

Nothing here names the URL's path or query, a token or a password: errors say what happened and where
(scheme, host, port).
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from laminar_assets.errors import ExportTargetError

from ..spec.exports import WebhookExport
from .connections import MASK, Connection
from .webhook_events import Event, dumps

SENT, FAILED, PENDING = "sent", "failed", "pending"
OUT_OF_TIME, UNREACHABLE, SILENT = "out of time", "unreachable", "stopped answering"
STOP_AFTER_SILENT = 3  # requests in a row without any answer that stop a delivery
USER_AGENT = "laminar-export"


@dataclass(frozen=True)
class Endpoint:
    """Where a webhook export's requests go: the URL (without user info) and the headers that authenticate
    them, from its connection; `where` (scheme, host, port) is all any message shows."""

    url: str
    where: str
    headers: dict[str, str]
    secrets: tuple[str, ...]

    @classmethod
    def of(cls, export: WebhookExport, connection: Connection) -> Endpoint:
        try:
            parts = urllib3.util.parse_url(connection.url)
        except urllib3.exceptions.LocationParseError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.host:
            raise ExportTargetError(f"export '{export.name}': connection '{connection.name}' is not an http(s) URL "
                                    f"({connection.safe_url}); expected e.g. https://alerts.example.com/hooks/trades",
                                    export=export.name, connection=connection.name)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        headers: dict[str, str] = {}
        secrets = [s for s in (connection.option("token"), connection.option("password"), parts.auth, parts.query)
                   if s]
        if parts.path and len(parts.path) > 1:
            secrets.append(parts.path)  # a path may be the secret itself (Slack's hooks/services/T../B../X..)
        user, _, password = (parts.auth or "").partition(":")
        password = connection.option("password") or password
        if user or password:
            headers.update(urllib3.util.make_headers(basic_auth=f"{user}:{password}"))
        if connection.option("token"):
            headers["Authorization"] = f"Bearer {connection.option('token')}"
        url = parts._replace(auth=None).url
        return cls(url, f"{parts.scheme}://{parts.host}:{port}", headers, tuple(sorted(set(secrets), key=len, reverse=True)))

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if len(secret) >= 4:
                text = text.replace(secret, MASK)
        return text


@dataclass
class Request:
    """One POST: its events (one, or `rows_per_request`), body and idempotency key."""

    index: int
    events: list[Event]
    body: bytes
    key: str

    @classmethod
    def of(cls, index: int, events: list[Event], export: WebhookExport) -> Request:
        if len(events) == 1:
            body, key = dumps(events[0].body(export)), events[0].key
        else:
            body = dumps({"export": export.name, "source": export.source, "events": [e.body(export) for e in events]})
            key = hashlib.sha256("\n".join(e.key for e in events).encode()).hexdigest()
        return cls(index, events, body.encode(), key)


@dataclass
class Outcome:
    state: str  # SENT, FAILED (every attempt failed, or a final refusal) or PENDING (not done: for the next delivery)
    status: int | None = None  # the last answer's HTTP status; None when none came
    error: str = ""
    attempts: int = 0
    answered: bool = False  # whether any attempt had an answer


@dataclass
class Sent:
    """One request as the delivery keeps it until it is part of the done prefix: its rows, where its events
    are in the delivery's order, what became of it, its events (kept only while they may go to the dead letters)."""

    index: int
    rows: int
    last: tuple
    events: list[Event]
    outcome: Outcome | None = None  # None while in flight


@dataclass
class Report:
    """What a delivery's requests did. The done prefix: the requests, in order, up to the first one not done
    (pending, or not sent); the delivery's progress is where its last event is (`done_last`). Requests after it
    may have gone out too (counted in `sent_rows`): the next delivery sends them again, under the same keys."""

    stopped: str | None = None  # OUT_OF_TIME, UNREACHABLE, SILENT, or None (every request went)
    answered: bool = False  # whether the receiver answered any request
    done_rows: int = 0
    done_last: tuple | None = None
    dead: list[tuple[Event, Outcome]] = field(default_factory=list)  # the done prefix's failed rows
    sent_rows: dict[str, int] = field(default_factory=dict)  # by op, every request answered 2xx
    retries: int = 0
    requests: int = 0
    first_error: str = ""  # of a request without an answer (what "unreachable" says)


class Sender:
    """Sends one delivery's requests (see the module's docstring); `hook(step)` is called after each answer
    (the crash tests stop there)."""

    def __init__(self, export: WebhookExport, endpoint: Endpoint, deadline: float, hook: Callable[[str], None]) -> None:
        self.export = export
        self.endpoint = endpoint
        self.deadline = deadline
        self.hook = hook
        self.timeout = urllib3.Timeout(connect=export.timeout_seconds, read=export.timeout_seconds)
        self._abort = threading.Event()
        self._answered = threading.Event()

    def run(self, requests: Iterable[Request]) -> Report:
        export = self.export
        report = Report()
        window: deque[Sent] = deque()  # from the first request not done on
        in_flight: dict[Future, Sent] = {}
        silent: list[Sent] = []  # failed without an answer since the last answer: dead letters, or pending
        pool = urllib3.PoolManager(num_pools=1, maxsize=export.max_in_flight, block=True, retries=False)
        executor = ThreadPoolExecutor(export.max_in_flight, thread_name_prefix=f"laminar-webhook-{export.name}")
        pace = time.monotonic()

        def settle() -> None:
            """Move the requests at the window's head that are done (and no longer in a silent streak) to the
            done prefix."""
            while window and window[0].outcome is not None and window[0].outcome.state != PENDING \
                    and not any(window[0] is s for s in silent):
                head = window.popleft()
                assert head.outcome is not None  # the loop's condition: the head is no longer in flight
                report.done_rows += head.rows
                report.done_last = head.last
                if head.outcome.state == FAILED:
                    report.dead += [(e, head.outcome) for e in head.events]

        def collect(block: bool) -> None:
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED, timeout=None if block else 0)
            for future in done:
                item = in_flight.pop(future)
                outcome = item.outcome = future.result()
                report.retries += max(0, outcome.attempts - 1)
                if outcome.state == SENT:
                    for e in item.events:
                        report.sent_rows[e.op] = report.sent_rows.get(e.op, 0) + 1
                if outcome.state != FAILED:
                    item.events = []
                if outcome.state == FAILED and not outcome.answered:
                    report.first_error = report.first_error or outcome.error
                    silent.append(item)
                    if len(silent) >= STOP_AFTER_SILENT:
                        report.stopped = report.stopped or (SILENT if self._answered.is_set() else UNREACHABLE)
                        self._abort.set()
                elif outcome.answered:
                    silent.clear()
                settle()
                self.hook("export_after_request")

        try:
            for request in requests:
                while len(in_flight) >= export.max_in_flight and not report.stopped:
                    collect(block=True)
                if report.stopped:
                    break
                now = time.monotonic()
                if max(now, pace) >= self.deadline:
                    report.stopped = OUT_OF_TIME
                    break
                if pace > now and self._abort.wait(pace - now):
                    break
                if export.max_rows_per_second:
                    pace = max(pace, now) + len(request.events) / export.max_rows_per_second
                item = Sent(request.index, len(request.events), request.events[-1].place, request.events)
                window.append(item)
                report.requests += 1
                in_flight[executor.submit(self._send, pool, request)] = item
                collect(block=False)
            while in_flight:
                collect(block=True)
        finally:
            self._abort.set()
            executor.shutdown(wait=True, cancel_futures=True)
            pool.clear()
        report.answered = self._answered.is_set()
        if silent and not report.answered:
            report.stopped = UNREACHABLE  # fewer requests than STOP_AFTER_SILENT, none answered
        if report.stopped == UNREACHABLE and report.answered:
            report.stopped = SILENT  # an answer came while the failures were in flight
        if report.stopped in (UNREACHABLE, SILENT):
            for item in silent:  # no answer because the receiver is gone: for the next delivery, not dead letters
                assert item.outcome is not None  # `collect` set it before putting the item in `silent`
                item.outcome.state = PENDING
        silent.clear()
        settle()
        return report

    def _send(self, pool: urllib3.PoolManager, request: Request) -> Outcome:
        export = self.export
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Idempotency-Key": request.key,
                   **self.endpoint.headers}
        outcome = Outcome(PENDING)
        while True:
            if self._abort.is_set() or time.monotonic() >= self.deadline:
                outcome.state = PENDING
                return outcome
            outcome.attempts += 1
            hint = None
            try:
                response = pool.request("POST", self.endpoint.url, body=request.body, headers=headers,
                                        timeout=self.timeout, retries=False, redirect=False)
            except (HTTPError, OSError) as exc:
                outcome.status, outcome.error, retry = None, self.endpoint.scrub(self._failure(exc)), True
            else:
                outcome.answered = True
                self._answered.set()
                outcome.status = response.status
                if 200 <= response.status < 300:
                    outcome.state, outcome.error = SENT, ""
                    return outcome
                text = " ".join(response.data[:300].decode("utf-8", "replace").split())
                outcome.error = self.endpoint.scrub(f"HTTP {response.status} {response.reason or ''}".strip()
                                                    + (f": {text}" if text else ""))
                retry = response.status >= 500 or response.status in (408, 429)
                hint = _retry_after(response.headers.get("Retry-After"))
            if not retry or outcome.attempts >= export.max_attempts:
                outcome.state = FAILED
                return outcome
            delay = min(export.max_backoff_seconds, export.backoff_seconds * 2 ** (outcome.attempts - 1))
            delay = delay * random.uniform(0.5, 1.0)  # apart: requests failing together do not retry together
            if hint is not None:
                delay = min(max(delay, hint), export.max_backoff_seconds)
            if time.monotonic() + delay >= self.deadline:
                outcome.state = PENDING  # no time left to try again: the next delivery does
                return outcome
            if self._abort.wait(delay):
                outcome.state = PENDING
                return outcome

    def _failure(self, exc: Exception) -> str:
        """What went wrong with a request that had no answer, in a few words (never the URL)."""
        seconds = f"{self.export.timeout_seconds:g}s"
        if isinstance(exc, NameResolutionError):
            return f"cannot resolve the host of {self.endpoint.where}"
        if isinstance(exc, NewConnectionError):
            found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
            return f"cannot connect ({found.group(1).strip() if found else 'connection failed'})"
        if isinstance(exc, ConnectTimeoutError):
            return f"no connection within {seconds}"
        if isinstance(exc, ReadTimeoutError):
            return f"no answer within {seconds}"
        if isinstance(exc, ProtocolError):
            inner = exc.args[1] if len(exc.args) > 1 else None
            return "the connection closed without an answer" + (f" ({inner})" if inner else "")
        if isinstance(exc, SSLError):
            return f"TLS failed ({str(exc).splitlines()[0][:200]})"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return f"{type(exc).__name__}" + (f" ({first})" if first else "")


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (its date form is not taken)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
