"""Whether a Spark Connect server still answers: `laminar serve` restarts one that hangs.

A server that dies is seen at once (its process exits: serve.py starts a new one). A server that hangs (a JVM
stopped with SIGSTOP, stuck in a deadlock, or paused by a swap storm) keeps its process and its port, and every
run's step waits on it without an error or a bound. So serve asks the server a question that needs no Spark job
(its Spark version, one `AnalyzePlan` call over gRPC with a deadline) every `every` seconds, in a thread of its
own; after `misses` questions in a row went unanswered within `every` seconds each, the server is hung. serve
then kills it and starts a new one on the same port, as for a server that died: the runs that waited on it lose
their session, which is a retryable error, and their retries go to the new server.

A busy server answers: the question is served by the gRPC threads, not by the Spark jobs that keep the driver
busy; the default (three misses of 30 s) takes a hang of 90 s or more, longer than any garbage collection pause
of the drivers `laminar serve` starts.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlparse

Ask = Callable[[str, float], str | None]


def ask_version(url: str, timeout: float) -> str | None:
    """Ask the server at `url` (sc://host:port) for its Spark version within `timeout` seconds: None when it
    answered, else what went wrong (the gRPC status and its details)."""
    import grpc
    from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc

    where = urlparse(url)
    request = base_pb2.AnalyzePlanRequest(session_id=_SESSION, user_context=base_pb2.UserContext(user_id="laminar-serve"),
                                          spark_version=base_pb2.AnalyzePlanRequest.SparkVersion())
    with grpc.insecure_channel(f"{where.hostname}:{where.port}") as channel:
        try:
            base_pb2_grpc.SparkConnectServiceStub(channel).AnalyzePlan(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return f"{code.name if code else 'error'}: {details}"
    return None


# one session on the server for every question of this process (a new id each time would leave a session per
# question until the server's idle timeout)
_SESSION = str(uuid.uuid4())


class ConnectProbe:
    """Asks the server at `url` every `every` seconds, each answer awaited `every` seconds; `hung` is set once
    `misses` questions in a row went unanswered (`why` then says what the last one got). `stop()` ends it."""

    def __init__(self, url: str, *, every: float, misses: int = 3, ask: Ask = ask_version) -> None:
        self.url = url
        self.every = every
        self.misses = misses
        self.hung = threading.Event()
        self.why = ""
        self.silent_since: float | None = None  # monotonic time of the first unanswered question in a row
        self._ask = ask
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"connect-probe {url}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        missed = 0
        while not self._stopped.wait(self.every):
            asked = time.monotonic()
            failure = self._ask(self.url, self.every)
            if self._stopped.is_set():
                return
            if failure is None:
                missed, self.silent_since = 0, None
                continue
            missed += 1
            self.silent_since = self.silent_since or asked
            self.why = failure
            if missed >= self.misses:
                self.hung.set()
                return

    def silent_seconds(self) -> float:
        return 0.0 if self.silent_since is None else time.monotonic() - self.silent_since

    def stop(self) -> None:
        """No more questions (a question under way ends within its deadline, in its daemon thread)."""
        self._stopped.set()
