"""Local S3 servers for the tests, bound to 127.0.0.1, time-bounded, and always stopped.

- moto's server mode (`moto_server`, from PyPI): the functional tests. It answers conditional
  writes (If-None-Match, If-Match) but checks them before it writes, not atomically: two writers
  racing on one key may both succeed. Tests that only run one writer at a time rely on it.
- s3proxy (Maven Central, filesystem backend; `make test-jars` installs it): the tests that race
  writers. It serialises a conditional write with the write itself, so of two racing
  put-if-absent requests exactly one succeeds.

Both also count the requests they serve by kind (moto through its request recorder), which the
benchmark's S3 variant reports.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from laminar_assets import storage
from laminar_assets.engine.spark import installed_jars
from laminar_assets.storage import ObjectStoreOptions
from tests.deploy.processes import free_port, listening, wait_for

KEY, SECRET = "laminar-test", "laminar-test-secret"


@dataclass
class S3Server:
    """A running local S3 server; `options` reach it, `bucket()` makes a new bucket."""

    kind: str
    endpoint: str
    process: subprocess.Popen
    folder: str

    @property
    def options(self) -> ObjectStoreOptions:
        return ObjectStoreOptions(endpoint=self.endpoint, region="us-east-1", access_key_id=KEY,
                                  secret_access_key=SECRET, path_style=True)

    def bucket(self, prefix: str = "lake") -> str:
        """A new bucket; returns `s3://<bucket>/<prefix>`."""
        name = f"t{uuid.uuid4().hex[:12]}"
        self.options.client().create_bucket(Bucket=name)
        return f"s3://{name}/{prefix}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(15)
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- request counts ------------------------------------------------------------------------
    def start_counting(self) -> None:
        if self.kind == "moto":
            self._moto("/moto-api/recorder/reset-recording")
            self._moto("/moto-api/recorder/start-recording")

    def counts(self) -> dict[str, int]:
        """Requests served since `start_counting`, by kind: LIST, GET, HEAD, PUT, DELETE, POST."""
        if self.kind != "moto":
            raise NotImplementedError("request counts come from moto's recorder")
        self._moto("/moto-api/recorder/stop-recording")
        raw = urllib.request.urlopen(f"{self.endpoint}/moto-api/recorder/download-recording", timeout=30).read()
        out: dict[str, int] = {}
        for line in raw.decode().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            method, query = entry.get("method", "?"), entry.get("qs") or {}
            if entry.get("uri", "").startswith("/moto-api"):
                continue
            kind = "LIST" if method == "GET" and ("list-type" in query or entry.get("uri", "").rstrip("/").count("/") <= 1) \
                else method
            out[kind] = out.get(kind, 0) + 1
        return out

    def _moto(self, path: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}{path}", method="POST"), timeout=30).read()


def start_moto(timeout: float = 60.0) -> S3Server:
    port = free_port()
    folder = tempfile.mkdtemp(prefix="laminar-moto-")
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    env = {**os.environ, "MOTO_ENABLE_RECORDING": "true"}
    log = open(os.path.join(folder, "moto.log"), "w")  # noqa: SIM115  (closed with the process)
    process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=folder)
    server = S3Server("moto", f"http://127.0.0.1:{port}", process, folder)
    try:
        wait_for(lambda: listening(port), timeout, f"moto_server on 127.0.0.1:{port}", every=0.2,
                 alive=lambda: process.poll() is None)
    except BaseException:
        server.stop()
        raise
    return server


def start_s3proxy(timeout: float = 60.0) -> S3Server:
    jars = installed_jars("s3proxy")
    if not jars:
        raise AssertionError("s3proxy is not installed: run `make test-jars` "
                             "(python -m laminar_assets.deploy.jar_installer s3proxy)")
    port = free_port()
    folder = tempfile.mkdtemp(prefix="laminar-s3proxy-")
    data = os.path.join(folder, "data")
    os.makedirs(data)
    conf = os.path.join(folder, "s3proxy.conf")
    with open(conf, "w") as fh:
        fh.write(f"s3proxy.endpoint=http://127.0.0.1:{port}\ns3proxy.authorization=aws-v2-or-v4\n"
                 f"s3proxy.identity={KEY}\ns3proxy.credential={SECRET}\njclouds.provider=filesystem\n"
                 f"jclouds.filesystem.basedir={data}\n")
    log = open(os.path.join(folder, "s3proxy.log"), "w")  # noqa: SIM115  (closed with the process)
    process = subprocess.Popen(["java", "-jar", jars[0], "--properties", conf], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder)
    server = S3Server("s3proxy", f"http://127.0.0.1:{port}", process, folder)
    try:
        wait_for(lambda: listening(port), timeout, f"s3proxy on 127.0.0.1:{port}", every=0.2,
                 alive=lambda: process.poll() is None)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def using(server: S3Server):
    """This process reaches `server` while the block runs (and what it reached before, after)."""
    before = storage.options()
    storage.configure(server.options)
    try:
        yield server
    finally:
        storage.configure(before)


def wait_until_gone(process: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
