"""A throwaway Redis server for tests: Debian's `redis-server` (`make redis` installs it), on 127.0.0.1 at a free
port, nothing saved to disk, one per test process (the session fixture `redis_server` in tests/conftest.py; each
test empties it first, `redis_url`). Stopped at the end of the session, also on failure, and its folder removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from laminar_assets.deploy.ports import ends_with_this_process
from tests.deploy.processes import free_port

START_SECONDS = 20


@dataclass
class RedisServer:
    port: int
    folder: str
    process: subprocess.Popen

    def url(self, db: int = 0, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user or ''}:{password}@" if password is not None else (f"{user}@" if user else "")
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_timeout=10, decode_responses=True)

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def start_redis() -> RedisServer:
    """Start `redis-server` in a new folder and wait until it answers PING (a port another process took meanwhile:
    another port)."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("the Redis export tests need Debian's redis-server: run `make redis` (apt-get install -y "
                           "redis-server)")
    for _ in range(3):
        folder = tempfile.mkdtemp(prefix="laminar-redis-")
        port = free_port()
        process = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                    "--dir", folder, "--logfile", f"{folder}/redis.log"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   preexec_fn=ends_with_this_process())  # a worker killed hard takes it along
        server = RedisServer(port, folder, process)
        deadline = time.monotonic() + START_SECONDS
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(redis.ConnectionError):
                if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1).ping():
                    return server
            time.sleep(0.05)  # polling for the server to answer, not synchronizing the test
        logfile = os.path.join(folder, "redis.log")
        log = open(logfile).read()[-2000:] if os.path.exists(logfile) else ""
        server.stop()
        if "Address already in use" not in log:
            raise RuntimeError(f"redis-server did not answer PING on 127.0.0.1:{port} within {START_SECONDS} s: {log}")
    raise RuntimeError("redis-server found no free port on 127.0.0.1 in three tries")
