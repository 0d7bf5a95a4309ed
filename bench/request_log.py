"""Where every object-store request of a run goes: by phase of the run and by the object it touches.

The local S3 server (moto, `laminar_assets.deploy.local_s3.LocalS3`) records every request it serves,
in order (its recorder). `RequestLog` reads that recording and tells each request's

- **object**: what it touched, from its key under the lake: `lease`, `watermark` (intents and watermarks
  are one object per partition), `sweep`, `outcome`, the Delta logs (`source log`, `state log`,
  `sink log`, `quarantine log`), `state files`, `sink files`, `source files` (Parquet files written by a PUT,
  read by a GET or HEAD);
- **phase**: the step of the run it happened in. `phases(log)` wraps the engine's steps (settle,
  gather, plan, sweep, intent, pass, watermark, outcome, clean-up) for the block's duration and
  marks each boundary in the recording with a request of its own to a bucket that does not exist
  (`/laminar-phase/<phase>`, about a millisecond; left out of the counts, and spared the server's
  latency when it has one: header `X-Laminar-No-Latency`); the product's code is not changed and pays
  nothing.
- **client**: which library sent it (Laminar's own boto3 calls, deltalake, pyarrow, Spark's s3a).

Used by the benchmark's S3 variant (bench/object_store.py) and the request-budget tests
(tests/engine/test_request_budget.py). Counts are exact: the server serves one request per call.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from unittest import mock
from urllib.parse import parse_qs, quote, unquote, urlsplit

from laminar_assets.deploy.local_s3 import NO_LATENCY_HEADER

MARKER = "laminar-phase"  # the bucket of phase markers (never created)


@dataclass(frozen=True)
class Request:
    method: str  # GET, HEAD, PUT, POST, DELETE
    kind: str  # the method, or LIST for a listing
    bucket: str
    key: str
    client: str
    phase: str

    @property
    def object(self) -> str:
        return object_of(self.key)


def object_of(key: str) -> str:
    """What a request's key is, in Laminar's lake (see the module docstring)."""
    parts = key.split("/")
    if "_laminar" in parts:
        rest = parts[parts.index("_laminar") + 1:]
        top = rest[0] if rest else ""
        if top == "locks":
            return "lease"
        if top in ("watermarks", "checkpoints"):  # a block of them; one file each before blocks
            return "watermark"
        if top == "sweeps":
            return "sweep"
        if top == "outcomes":
            return "outcome"
        if top in ("state", "quarantine"):
            return f"{top} {'log' if '_delta_log' in parts else _file(parts)}"
        return f"_laminar/{top}"
    if "_delta_log" in parts:
        return "sink log" if _is_sink(parts) else "source log"
    return ("sink " if _is_sink(parts) else "source ") + _file(parts)


_SINKS: set[str] = set()  # top-level table folders the runs write (set by `RequestLog.sinks`)


def _is_sink(parts: list[str]) -> bool:
    return any(p in _SINKS for p in parts)


def _file(parts: list[str]) -> str:
    """Data files (written by a run ahead of its commit, or committed: a PUT of them is a write, a GET or
    HEAD a read), or a listing of a folder of them."""
    return "listing" if not parts[-1] else "files"


def _client(headers: dict) -> str:
    agent = str(headers.get("User-Agent") or headers.get("user-agent") or "")
    if "Boto3" in agent or "Botocore" in agent:
        return "boto3"
    if "object_store" in agent or "delta" in agent.lower():
        return "deltalake"
    if "aws-sdk-java" in agent or "Hadoop" in agent or "hadoop" in agent:
        return "s3a"
    if "arrow" in agent.lower() or "aws-sdk-cpp" in agent:
        return "pyarrow"
    return agent.split("/", 1)[0] or "?"


class RequestLog:
    """The recorder of one local S3 server (`endpoint`): `start()`, run, `requests()`."""

    def __init__(self, endpoint: str, *, sinks: tuple[str, ...] = ()) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.sinks = set(sinks)

    def start(self) -> None:
        self._post("/moto-api/recorder/reset-recording")
        self._post("/moto-api/recorder/start-recording")

    def mark(self, phase: str) -> None:
        """Requests recorded from now on belong to `phase` (a marker request in the recording)."""
        try:
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{MARKER}/{quote(phase)}", method="HEAD",
                                                          headers={NO_LATENCY_HEADER: "1"}), timeout=30).read()
        except urllib.error.HTTPError:
            pass  # the bucket does not exist: the server answers 404, and has recorded the request

    def requests(self) -> list[Request]:
        """Every S3 request since `start`, in order (recording stops)."""
        self._post("/moto-api/recorder/stop-recording")
        _SINKS.clear()
        _SINKS.update(self.sinks)
        out, phase = [], "other"
        for line in self._lines():
            entry = json.loads(line)
            url = urlsplit(entry.get("url") or entry.get("uri") or "")
            if url.path.startswith("/moto-api"):
                continue
            bucket, _, key = unquote(url.path).lstrip("/").partition("/")
            if bucket == MARKER:
                phase = key
                continue
            qs = parse_qs(url.query)
            method = entry.get("method", "?")
            listing = method == "GET" and (not key or "list-type" in qs or "prefix" in qs)
            if listing:
                key = (qs.get("prefix") or [""])[0]
            out.append(Request(method, "LIST" if listing else method, bucket, key, _client(entry.get("headers") or {}),
                               phase))
        return out

    def _lines(self) -> list[str]:
        raw = urllib.request.urlopen(f"{self.endpoint}/moto-api/recorder/download-recording", timeout=60).read()
        return [line for line in raw.decode().splitlines() if line.strip()]

    def _post(self, path: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}{path}", method="POST"), timeout=30).read()


# The engine's steps, in the order a run passes them: (phase, object, attribute) wrapped by `phases`.
def _steps():
    from laminar_assets.engine import executor
    from laminar_assets.engine.output import uncommitted
    from laminar_assets.engine.run import protocol

    return [
        ("settle", executor.Engine, "_settle"),
        ("gather", executor.Engine, "gather"),
        ("plan", executor.Engine, "_plan_all"),
        ("sweep", executor.Engine, "_sweep"),
        ("noop watermark", protocol, "record_noops"),
        ("intent", protocol, "begin_all"),
        ("pass", executor.Engine, "_pass"),
        ("watermark", protocol, "finish_all"),
        ("outcome", executor.Engine, "_record_outcomes"),
        ("clean-up", uncommitted, "scope"),
    ]


@contextmanager
def phases(log: RequestLog) -> Iterator[RequestLog]:
    """While the block runs, every engine step marks its start in `log` and, when it returns, the phase
    it was called from (a lease's release is `lease`, the end of the uncommitted files' scope `clean-up`)."""
    stack: list[str] = ["other"]

    def wrap(phase, original, is_cm):
        if is_cm:
            @contextmanager
            def cm(*a, **kw):
                stack.append(phase)
                log.mark(phase)
                with original(*a, **kw):
                    stack.pop()
                    log.mark(stack[-1])
                    try:
                        yield
                    finally:
                        stack.append(phase)
                        log.mark(phase)
                stack.pop()
                log.mark(stack[-1])
            return cm

        def fn(*a, **kw):
            stack.append(phase)
            log.mark(phase)
            try:
                return original(*a, **kw)
            finally:
                stack.pop()
                log.mark(stack[-1])
        return fn

    with ExitStack() as patches:
        for phase, owner, name in _steps():
            original = getattr(owner, name)
            is_cm = name in ("leases", "scope")
            patches.enter_context(mock.patch.object(owner, name, wrap(phase, original, is_cm)))
        yield log


def table(requests: list[Request], by: str = "phase") -> dict[str, Counter]:
    """Counts by `by` (phase, object or client), each a Counter of request kinds."""
    out: dict[str, Counter] = {}
    for r in requests:
        out.setdefault(getattr(r, by), Counter())[r.kind] += 1
    return out


def render(requests: list[Request], by: str = "phase") -> str:
    kinds = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")
    rows = table(requests, by)
    lines = [f"{by:<22}" + "".join(f"{k:>7}" for k in kinds) + f"{'total':>7}"]
    for name, c in sorted(rows.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"{name:<22}" + "".join(f"{c.get(k, 0):>7}" for k in kinds) + f"{sum(c.values()):>7}")
    lines.append(f"{'all':<22}" + "".join(f"{sum(c.get(k, 0) for c in rows.values()):>7}" for k in kinds)
                 + f"{len(requests):>7}")
    return "\n".join(lines)
