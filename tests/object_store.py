"""Local S3 servers for the tests, bound to 127.0.0.1, time-bounded, and always stopped.

- moto's server mode (`moto_server`, from PyPI): the functional tests. It answers conditional
  writes (If-None-Match, If-Match) but checks them before it writes, not atomically: two writers
  racing on one key may both succeed. Tests that only run one writer at a time rely on it.
- s3proxy (Maven Central, filesystem backend; `make test-jars` installs it): the tests that race
  writers. It serialises a conditional write with the write itself, so of two racing
  put-if-absent requests exactly one succeeds.

moto runs through `laminar_assets.deploy.local_s3.LocalS3`, the server `make demo-s3` uses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from laminar_assets import storage
from laminar_assets.deploy.local_s3 import KEY, SECRET, LocalS3
from laminar_assets.engine.spark import installed_jars
from laminar_assets.storage import ObjectStoreOptions
from tests.deploy.processes import free_port, listening, wait_for


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


def start_moto(timeout: float = 60.0) -> S3Server:
    folder = tempfile.mkdtemp(prefix="laminar-moto-")
    server = LocalS3(free_port(), log=os.path.join(folder, "moto.log")).start(timeout)
    return S3Server("moto", server.endpoint, server.process, folder)


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
    """This process reaches `server` for every s3:// URI no engine mounted a store for, while the block
    runs (a scheme-wide mount; what was mounted there before, after)."""
    with storage.mounted("s3://", server.options):
        yield server
