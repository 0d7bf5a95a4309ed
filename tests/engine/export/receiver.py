"""A real HTTP receiver for the webhook export tests: a stdlib HTTP server in a thread on 127.0.0.1 (a free
port), which records every request it gets (headers and JSON body) and answers as told: 200, a status, `hang`
(no answer until the test ends: past the client's timeout), `close` (the connection dropped without an
answer), or not at all (`down`: nothing listens on its port until `up`). Stopped when the test ends, also on
failure (the `webhook_receiver` fixture, tests/conftest.py)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OK, HANG, CLOSE = 200, "hang", "close"


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: dict
    answer: int | str

    @property
    def key(self) -> str:
        return self.headers["idempotency-key"]

    @property
    def events(self) -> list[dict]:
        return self.body["events"] if "events" in self.body else [self.body]


class Receiver:
    def __init__(self) -> None:
        with socket.socket() as probe:  # a free port, kept for the receiver's whole life (down, then up again)
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.received: list[Received] = []
        self.script: list[int | str] = []  # answers for the next requests, in order; then `rule`, then `default`
        self.rule: Callable[[dict], int | str | None] | None = None
        self.default: int | str = OK
        self._lock = threading.Lock()
        self._release = threading.Event()  # ends every hang (when the test ends)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/alerts"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver

            def do_POST(self) -> None:  # noqa: N802  (the stdlib's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = receiver._answer(body)
                with receiver._lock:
                    receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body, answer))
                if answer == HANG:
                    receiver._release.wait(60)
                    self.close_connection = True
                    return
                if answer == CLOSE:
                    self.close_connection = True
                    return
                payload = b'{"ok": true}' if answer == OK else b'{"error": "try later"}'
                self.send_response(int(answer))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Nothing listens on the port (connections are refused) until `up`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(10)
            self._server = self._thread = None

    def stop(self) -> None:
        self._release.set()
        self.down()

    def _answer(self, body: dict) -> int | str:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        if self.rule is not None:
            found = self.rule(body)
            if found is not None:
                return found
        return self.default

    # --- what it got --------------------------------------------------------------------
    def events(self, *, answered: int | None = OK) -> list[dict]:
        """The events of the requests it answered with `answered` (None: every request)."""
        with self._lock:
            got = list(self.received)
        return [e for r in got if answered is None or r.answer == answered for e in r.events]

    def since(self, start: int) -> list[Received]:
        """The requests it got from request number `start` on (`len(received)` marks where a delivery began)."""
        with self._lock:
            return list(self.received[start:])

    def clear(self) -> None:
        with self._lock:
            self.received.clear()
