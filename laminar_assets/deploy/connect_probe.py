"""Whether a Spark Connect server still answers: `laminar serve` restarts one that hangs.

A server that dies is seen at once (its process exits: serve.py starts a new one). A server that hangs (a JVM
stopped with SIGSTOP, stuck in a deadlock, or paused by a swap storm) keeps its process and its port, and every
run's step waits on it without an error or a bound. So serve asks the server a question that needs no Spark job
(its Spark version, one `AnalyzePlan` call over gRPC with a deadline) every `every` seconds, in a thread of its
own, on one channel (a new connection to a stopped JVM fails only after gRPC's 20-s connect timeout, and says
UNAVAILABLE as if nothing listened). After `misses` questions in a row went unanswered within their deadline, the
server is hung. serve then kills it and starts a new one on the same port, as for a server that died: the runs
that waited on it lose their session, which is a retryable error, and their retries go to the new server.

A busy server answers: the question is served by the gRPC threads, not by the Spark jobs that keep the driver
busy; the default (three questions 10 s apart, each awaited 10 s) takes a hang of 30-40 s, far longer than a
garbage collection pause of the drivers `laminar serve` starts.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

Ask = Callable[[Any, float], str | None]  # (a channel, or what a test's ask takes; seconds) -> failure


def ask_version(channel, timeout: float) -> str | None:
    """Ask the server on `channel` (a grpc channel) for its Spark version within `timeout` seconds: None when it
    answered, else what went wrong, in words."""
    import grpc
    from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc

    request = base_pb2.AnalyzePlanRequest(session_id=_SESSION, user_context=base_pb2.UserContext(user_id="laminar-serve"),
                                          spark_version=base_pb2.AnalyzePlanRequest.SparkVersion())
    try:
        base_pb2_grpc.SparkConnectServiceStub(channel).AnalyzePlan(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer within {timeout:g} s"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        return f"{code.name if code else 'error'}: {details}"
    return None


def channel_to(url: str):
    """A gRPC channel to the server at `url` (sc://host:port)."""
    import grpc

    where = urlparse(url)
    return grpc.insecure_channel(f"{where.hostname}:{where.port}")


# one session on the server for every question of this process (a new id each time would leave a session per
# question until the server's idle timeout)
_SESSION = str(uuid.uuid4())
QUESTION_SECONDS = 10.0  # the longest wait for one answer


class ConnectProbe:
    """Asks the server at `url` a question every `every` seconds (from the start of one to the next), each answer
    awaited `min(every, QUESTION_SECONDS)` seconds; `hung` is set once `misses` questions in a row went unanswered
    (`why` then says what the last one got). `stop()` ends it."""

    def __init__(self, url: str, *, every: float, misses: int = 3, ask: Ask = ask_version) -> None:
        self.url = url
        self.every = every
        self.timeout = min(every, QUESTION_SECONDS)
        self.misses = misses
        self.hung = threading.Event()
        self.why = ""
        self.silent_since: float | None = None  # monotonic time of the first unanswered question in a row
        self._ask = ask
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"connect-probe {url}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        channel = channel_to(self.url) if self._ask is ask_version else None
        try:
            missed, asked = 0, time.monotonic()
            while not self._stopped.wait(max(0.0, asked + self.every - time.monotonic())):
                asked = time.monotonic()
                failure = self._ask(channel if channel is not None else self.url, self.timeout)
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
        finally:
            if channel is not None:
                channel.close()

    def silent_seconds(self) -> float:
        return 0.0 if self.silent_since is None else time.monotonic() - self.silent_since

    def stop(self) -> None:
        """No more questions (a question under way ends within its deadline, in its daemon thread)."""
        self._stopped.set()
