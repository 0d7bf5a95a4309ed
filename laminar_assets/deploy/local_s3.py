"""The local S3 server: moto's, on 127.0.0.1, in memory, with a request recorder and a latency.

`LocalS3` is what the tests, the benchmark and `make demo-s3` / `make ui-s3` run
(`python -m laminar_assets.deploy.local_store s3 [--bucket NAME] [--seconds N] [--latency-ms MS] -- COMMAND`,
deploy/local_store.py, the runner of the three local stores, which imports this module).
moto[server] comes with the project's dev extras. A latency (`latency_ms`) is slept before each S3
request: an in-memory server answers in about a millisecond, S3 in the same region in about 20 to the
first byte (local_s3_server.py does the waiting).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from urllib.parse import urlsplit

from laminar_assets.errors import EnvironmentProblem, LaminarError
from laminar_assets.storage import ObjectStoreOptions

from .local_s3_server import LATENCY_PATH, NO_LATENCY_HEADER
from .ports import ends_with_this_process, free_port, stop_group, wait_listening

__all__ = ["KEY", "LATENCY_PATH", "NO_LATENCY_HEADER", "SECRET", "LocalS3"]

KEY, SECRET = "laminar-local", "laminar-local-secret"


class LocalS3:
    """moto's S3 server on 127.0.0.1 (started by `start`, stopped by `stop`, also as a context manager),
    with a count of the requests it serves by kind (its request recorder) and an optional latency slept
    before each S3 request (`latency_ms`, changed while it runs by `set_latency`; 0: none). The process
    is local_s3_server.py: moto's own WSGI application behind the latency."""

    def __init__(self, port: int | None = None, *, log: str | None = None, latency_ms: float = 0.0) -> None:
        _check_latency(latency_ms)
        self.port = port or free_port()
        self.log = log
        self.latency_ms = float(latency_ms)
        self.process: subprocess.Popen | None = None
        self._recording_dir: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> ObjectStoreOptions:
        return ObjectStoreOptions(endpoint=self.endpoint, region="us-east-1", access_key_id=KEY,
                                  secret_access_key=SECRET, path_style=True)

    def start(self, timeout: float = 30.0) -> LocalS3:
        missing = [m for m in ("moto", "flask", "werkzeug") if importlib.util.find_spec(m) is None]
        if missing:
            raise EnvironmentProblem(f"moto's S3 server is not installed (no {', '.join(missing)}): `make install` "
                                     "installs it (the project's dev extras), or `pip install 'moto[server]'`")
        # the recorder stays off until `start_counting`; its file lives in a temporary folder, not the cwd
        self._recording_dir = tempfile.mkdtemp(prefix="laminar-s3-recording-")
        self._recording = os.path.join(self._recording_dir, "requests.jsonl")
        server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_s3_server.py")
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115  (closed once passed on)
        try:
            self.process = subprocess.Popen(
                [sys.executable, server, "--host", "127.0.0.1", "--port", str(self.port),
                 "--latency-ms", repr(self.latency_ms)], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=ends_with_this_process(),
                env={**os.environ, "MOTO_RECORDER_FILEPATH": self._recording})
        finally:
            if not isinstance(out, int):
                out.close()  # the server writes to its own copy
        see = f"; its output is in {self.log}" if self.log else " (pass log=FILE to LocalS3 to keep its output)"
        try:
            wait_listening(self.port, "the local S3 server (moto)", timeout=timeout, exited=self.process.poll, see=see,
                           every=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def set_latency(self, ms: float) -> None:
        """From now on, sleep `ms` milliseconds before each S3 request (0: none); the server confirms it."""
        _check_latency(ms)
        raw = urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}{LATENCY_PATH}?ms={float(ms)!r}",
                                                            method="POST"), timeout=30).read()
        self.latency_ms = float(raw.decode().strip())

    def server_latency_ms(self) -> float:
        """The latency the running server applies, as it answers it."""
        raw = urllib.request.urlopen(f"{self.endpoint}{LATENCY_PATH}", timeout=30).read()
        return float(raw.decode().strip())

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, timeout=15)
        if self._recording_dir:
            shutil.rmtree(self._recording_dir, ignore_errors=True)

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def create_bucket(self, name: str) -> str:
        self.options.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    # --- request counts -------------------------------------------------------------------------
    def start_counting(self) -> None:
        self._post("/moto-api/recorder/reset-recording")
        self._post("/moto-api/recorder/start-recording")

    def counts(self) -> dict[str, int]:
        """Requests served since `start_counting`, by kind: LIST, GET, HEAD, PUT, POST, DELETE."""
        self._post("/moto-api/recorder/stop-recording")
        raw = urllib.request.urlopen(f"{self.endpoint}/moto-api/recorder/download-recording", timeout=60).read()
        out: dict[str, int] = {}
        for line in raw.decode().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            path = urlsplit(entry.get("url") or entry.get("uri") or "").path
            if path.startswith("/moto-api"):
                continue
            method = entry.get("method", "?")
            listing = method == "GET" and (path.rstrip("/").count("/") <= 1 or "list-type" in (entry.get("qs") or {}))
            kind = "LIST" if listing else method
            out[kind] = out.get(kind, 0) + 1
        return out

    def _post(self, path: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}{path}", method="POST"), timeout=30).read()


def _check_latency(ms: float) -> None:
    if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms >= 0):
        raise LaminarError(f"the local S3 server's latency must be a number of milliseconds >= 0, not {ms!r}",
                           latency_ms=ms)
