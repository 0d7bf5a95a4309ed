"""moto's S3 server with a per-request latency: the process `LocalS3` (local_s3.py) starts.

Usage: python laminar_assets/deploy/local_s3_server.py --port N [--host 127.0.0.1] [--latency-ms MS]

It serves moto's own WSGI application the way `moto_server` does (moto/server.py: the domain
dispatcher over moto's backends, werkzeug's threaded server with moto's request handler, so the
request recorder of MOTO_RECORDER_FILEPATH works as there), wrapped in `with_latency`: a middleware
that sleeps the latency before each request, so a local in-memory server answers like a real store
(about 20 ms to the first byte for S3 in the same region) and the seconds a run takes on it mean
something. Requests run in threads, so concurrent requests wait side by side, as on a real store.

Not delayed: moto's control calls (`/moto-api/...`, e.g. the recorder's), requests that carry the
header `X-Laminar-No-Latency` (a measurement's own marker requests, bench/request_log.py), and the
latency's own control path, `/moto-api/laminar/latency`: GET answers the latency in milliseconds,
POST with `?ms=N` sets it (the benchmark prepares a round at 0 ms and times it at 20 ms).

Run by its path, not with `-m`: the process imports only moto and werkzeug, not Laminar's packages
(the engine, pyspark), so it listens as soon as moto does. This module imports nothing from moto at
import time, so local_s3.py can take its names from it.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
from typing import Any, cast
from urllib.parse import parse_qs

LATENCY_PATH = "/moto-api/laminar/latency"
NO_LATENCY_HEADER = "X-Laminar-No-Latency"
_NO_LATENCY_ENVIRON = "HTTP_" + NO_LATENCY_HEADER.upper().replace("-", "_")


class Latency:
    """The current per-request latency, in seconds, shared by the server's threads (one attribute, replaced
    whole: a thread reads the old value or the new one)."""

    def __init__(self, ms: float = 0.0) -> None:
        self.seconds = 0.0
        self.set_ms(ms)

    def set_ms(self, ms: float) -> None:
        if not (ms >= 0 and math.isfinite(ms)):  # also refuses NaN
            raise ValueError(f"latency must be a finite number of ms >= 0, not {ms!r}")
        self.seconds = ms / 1000.0

    @property
    def ms(self) -> float:
        return self.seconds * 1000.0


def with_latency(app, latency: Latency):
    """`app` (a WSGI application) with `latency` slept before each request it serves, except the ones the
    module docstring names; answers the latency's control path itself."""

    def wrapped(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == LATENCY_PATH:
            return _control(environ, start_response, latency)
        if latency.seconds > 0 and not path.startswith("/moto-api/") and not environ.get(_NO_LATENCY_ENVIRON):
            time.sleep(latency.seconds)
        return app(environ, start_response)

    return wrapped


def _control(environ, start_response, latency: Latency):
    method = environ.get("REQUEST_METHOD", "GET")
    if method == "POST":
        raw = (parse_qs(environ.get("QUERY_STRING", "")).get("ms") or [""])[0]
        try:
            latency.set_ms(float(raw))
        except ValueError as exc:
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [f"{LATENCY_PATH}: give ?ms=N with N >= 0 ({exc})\n".encode()]
    elif method != "GET":
        start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, POST")])
        return [b"GET or POST\n"]
    body = f"{latency.ms:g}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def _serialize_recorder() -> None:
    """One request recorded at a time. moto's recorder appends each request (body included) to its file with
    two writes and no lock; the server's threads interleaved them (seen as a JSON line holding two requests
    when the benchmark's full recompute uploaded files in parallel), so the counts could not be read."""
    from moto.moto_api import recorder

    record, lock = recorder._record_request, threading.Lock()

    def locked(*args, **kwargs):
        with lock:
            return record(*args, **kwargs)

    cast(Any, recorder)._record_request = locked  # replaces moto's method on its one recorder (monkeypatch)


def _list_services_once() -> None:
    """moto's dispatcher asks, for every request, whether the Host header names one of its services by
    listing its package folder and testing each of some 170 entries for being a folder: 60 % of the
    server's CPU on Laminar's requests (py-spy, the stateful test on S3). The folder does not change while
    the server runs, so it is listed once."""
    import functools

    from moto import backends

    listing = backends.list_of_moto_modules
    backends.list_of_moto_modules = functools.cache(lambda: tuple(listing()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="slept before each S3 request (default 0)")
    args = parser.parse_args(argv)
    try:
        latency = Latency(args.latency_ms)
    except ValueError as exc:
        parser.error(str(exc))

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto/server.py: moto builds some URLs from it
    _serialize_recorder()
    _list_services_once()

    def stop(*_):
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    app = DomainDispatcherApplication(create_backend_app)
    cast(Any, app).debug = True  # as moto/server.py (an attribute the class does not declare)
    run_simple(args.host, args.port, with_latency(app, latency), threaded=True, request_handler=MotoRequestHandler)
    return 0


if __name__ == "__main__":
    # run by path, Python put this folder first on sys.path, where a sibling (serve.py, ...) could shadow a
    # library's module of the same name
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    sys.exit(main())
