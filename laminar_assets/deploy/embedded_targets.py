"""Embedded export targets for `laminar demo` and `laminar serve`, so the exports of the demo pipeline deliver
with nothing installed by hand.

For each connection that an export of the definitions names and that nothing defines
(no `LAMINAR_CONNECTION_<NAME>_URL` in the environment), this starts a local target and sets that variable
while the command runs:

- a Postgres export's connection: a Postgres server (pgserver's bundled binaries) listening on a Unix socket
  only (no TCP port), its data in `<folder>/postgres` (`embedded_folder`: one folder per lake), kept between
  commands (`laminar serve` after `laminar demo` goes on from the demo's delivered version); one database per
  connection, named like it;
- a webhook export's connection: an HTTP receiver on 127.0.0.1 (a port of its own) that answers 200 and appends
  every request it gets to `<folder>/webhooks/<connection>.jsonl`, one JSON line per request (its
  `Idempotency-Key` and body).

A connection the environment defines is used as it is: nothing is started for it. A Redis export's connection
is not embedded: define it. `EmbeddedTargets.stop()` stops both (also as a context manager: on a failure and on
Ctrl-C); pgserver also stops its server when the process exits. A target that does not start in `timeout`
seconds fails in one line (`EnvironmentProblem`).
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from laminar_assets.errors import EnvironmentProblem

EMBEDDED_KINDS = ("postgres", "webhook")


@dataclass(frozen=True)
class EmbeddedTarget:
    """One connection served here: its name, the export kind, its URL (no secret: the server trusts local
    users) and where what it received can be seen."""

    connection: str
    kind: str
    url: str
    where: str


class _Receiver(ThreadingHTTPServer):
    """An HTTP server that stores every POST it gets (a JSON line per request, per connection) and answers 200."""

    daemon_threads = True

    def __init__(self, folder: str, connections: Iterable[str]) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.folder = folder
        self.connections = set(connections)
        self.lock = threading.Lock()

    def file(self, connection: str) -> str:
        return os.path.join(self.folder, f"{connection}.jsonl")


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        connection = self.path.strip("/").split("?")[0]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if connection not in self.server.connections:
            self._answer(404)
            return
        try:
            payload = json.loads(body)
        except ValueError:
            self._answer(400)
            return
        line = json.dumps({"received_at": datetime.now(UTC).isoformat(), "idempotency_key":
                           self.headers.get("Idempotency-Key"), "body": payload})
        with self.server.lock, open(self.server.file(connection), "a") as fh:
            fh.write(line + "\n")
        self._answer(200)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet: the demo prints its own table
        pass


@dataclass
class EmbeddedTargets:
    """The targets started for the connections nothing defines; `stop()` stops them and restores the environment."""

    folder: str
    targets: list[EmbeddedTarget] = field(default_factory=list)
    _postgres: Any = None  # pgserver's PostgresServer (untyped)
    _receiver: _Receiver | None = None
    _environ: MutableMapping[str, str] | None = None
    _previous: dict[str, str | None] = field(default_factory=dict)

    def where(self, connection: str) -> str | None:
        """Where a connection's deliveries can be seen (a Postgres socket and database, a receiver's file), or None
        when it is not embedded."""
        return next((t.where for t in self.targets if t.connection == connection), None)

    def received_file(self, connection: str) -> str | None:
        return self._receiver.file(connection) if self._receiver and connection in self._receiver.connections else None

    def stop(self) -> None:
        if self._environ is not None:
            for name, value in self._previous.items():
                if value is None:
                    self._environ.pop(name, None)
                else:
                    self._environ[name] = value
            self._previous = {}
        if self._receiver is not None:
            self._receiver.shutdown()
            self._receiver.server_close()
            self._receiver = None
        if self._postgres is not None:
            try:
                self._postgres.cleanup()  # cleanup_mode "stop": stops the server, keeps its data
            finally:
                self._postgres = None

    def __enter__(self) -> EmbeddedTargets:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def embedded_folder(root: str, *, machine_folder: str | None = None) -> str:
    """Where the embedded targets of the lake at `root` keep their data, one folder per lake (another lake's
    deliveries, each a full resync, do not replace this one's): `embedded/<the lake's folder name>` beside a local
    lake (`.laminar/embedded/lake` for the default `.laminar/lake`, `.laminar/embedded/quality` for `make
    quality`'s); for a lake in a bucket, `embedded/<bucket>-<prefix>` in `machine_folder` (where the command keeps
    this machine's files, e.g. `laminar serve`'s logs; default `./.laminar`)."""
    from laminar_assets import storage

    local = storage.local_path(root)
    if local is not None and not storage.is_object_store(root):
        lake = os.path.abspath(local.rstrip("/"))
        return os.path.join(os.path.dirname(lake), "embedded", os.path.basename(lake) or "lake")
    where = storage.normalized(root).split("://", 1)[-1].strip("/")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", where) or "lake"
    return os.path.join(os.path.abspath(machine_folder or ".laminar"), "embedded", name)


def missing_connections(exports, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The connections of Postgres and webhook exports that the environment does not define: name -> kind."""
    from laminar_assets.engine.export import env_name

    environ = os.environ if environ is None else environ
    missing: dict[str, str] = {}
    for export in exports:
        if export.kind in EMBEDDED_KINDS and not environ.get(env_name(export.connection)):
            if missing.setdefault(export.connection, export.kind) != export.kind:
                raise EnvironmentProblem(f"connection '{export.connection}' is named by a {missing[export.connection]} "
                                         f"export and by {export.kind} export '{export.name}': define it (set "
                                         f"{env_name(export.connection)}); nothing embedded can serve both",
                                         connection=export.connection)
    return missing


def start_embedded_targets(exports, folder: str, *, environ: MutableMapping[str, str] | None = None,
                           timeout: float = 60.0, fresh: bool = False) -> EmbeddedTargets:
    """Start a target for every connection of `exports` the environment does not define, with its data under
    `folder`, and set their `LAMINAR_CONNECTION_<NAME>_URL` in `environ` (default: this process's environment,
    which the runs and `dagster dev` inherit) until `stop()`. `fresh`: empty the receiver's files first (the
    demo starts a new lake, so what was received before is not this demo's)."""
    from laminar_assets.engine.export import env_name

    environ = os.environ if environ is None else environ
    missing = missing_connections(exports, environ)
    started = EmbeddedTargets(os.path.abspath(folder), _environ=environ)
    if not missing:
        return started
    try:
        databases = sorted(c for c, kind in missing.items() if kind == "postgres")
        hooks = sorted(c for c, kind in missing.items() if kind == "webhook")
        if databases:
            _start_postgres(started, databases, timeout)
        if hooks:
            _start_receiver(started, hooks, fresh)
        for target in started.targets:
            name = env_name(target.connection)
            started._previous[name] = environ.get(name)
            environ[name] = target.url
    except BaseException:
        started.stop()
        raise
    return started


def _start_postgres(started: EmbeddedTargets, databases: list[str], timeout: float) -> None:
    """pgserver on `<folder>/postgres`, with a database per connection; time-bounded (a thread: pgserver's start
    has no timeout of its own)."""
    try:
        with warnings.catch_warnings():  # platformdirs' "XDG_RUNTIME_DIR is not set" on import: not the user's concern
            warnings.simplefilter("ignore")
            import pgserver
        import psycopg
    except ImportError as exc:
        raise EnvironmentProblem(f"the embedded Postgres needs pgserver and psycopg ({exc.name} is missing): "
                                 "`make install`, or set " + ", ".join(f"LAMINAR_CONNECTION_{d.upper()}_URL"
                                                                       for d in databases)) from None
    data = os.path.join(started.folder, "postgres")
    os.makedirs(started.folder, exist_ok=True)
    outcome: dict = {}

    def start() -> None:
        try:
            outcome["server"] = pgserver.get_server(data, cleanup_mode="stop")
        except Exception as exc:  # noqa: BLE001 - reported below as one line
            outcome["error"] = exc

    thread = threading.Thread(target=start, name="laminar-embedded-postgres", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or "error" in outcome:
        found = f"{type(outcome['error']).__name__}: {outcome['error']}" if "error" in outcome else \
            f"not started within {timeout:.0f} s"
        raise EnvironmentProblem(f"the embedded Postgres of the demo's exports did not start ({found}); see "
                                 f"{os.path.join(data, 'log')}, or set " + ", ".join(
                                     f"LAMINAR_CONNECTION_{d.upper()}_URL" for d in databases) + " to a server of yours",
                                 folder=data)
    server = started._postgres = outcome["server"]
    socket_dir = server.get_postmaster_info().socket_dir
    with psycopg.connect(server.get_uri(), autocommit=True, connect_timeout=int(timeout)) as conn:
        have = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        for name in databases:
            if name not in have:
                conn.execute(f'CREATE DATABASE "{name}"')
    for name in databases:
        started.targets.append(EmbeddedTarget(name, "postgres", f"postgresql://postgres@/{name}?host={socket_dir}",
                                              f"embedded Postgres, database {name} (socket {socket_dir})"))


def _start_receiver(started: EmbeddedTargets, connections: list[str], fresh: bool) -> None:
    """The HTTP receiver on 127.0.0.1, serving in a daemon thread."""
    folder = os.path.join(started.folder, "webhooks")
    os.makedirs(folder, exist_ok=True)
    try:
        receiver = _Receiver(folder, connections)
    except OSError as exc:
        raise EnvironmentProblem(f"the embedded webhook receiver of the demo's exports cannot listen on 127.0.0.1 "
                                 f"({exc.strerror or exc}); set " + ", ".join(
                                     f"LAMINAR_CONNECTION_{c.upper()}_URL" for c in connections)) from None
    if fresh:
        for name in connections:
            open(receiver.file(name), "w").close()
    started._receiver = receiver
    threading.Thread(target=receiver.serve_forever, name="laminar-embedded-receiver", daemon=True).start()
    port = receiver.server_address[1]
    for name in connections:
        started.targets.append(EmbeddedTarget(name, "webhook", f"http://127.0.0.1:{port}/{name}",
                                              f"embedded receiver, {receiver.file(name)}"))
