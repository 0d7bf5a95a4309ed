"""A throwaway PostgreSQL server for tests: pgserver's bundled binaries, listening on a Unix socket only (no TCP
port), one per test process (the session fixture `pg_server` in tests/conftest.py), a database of its own per test.

Besides the superuser, the server has `laminar_pw`, the one role that must give a password (scram-sha-256; its
password is `PASSWORD`), so a wrong one is refused as on a real server.

Clients that speak TCP only (PostgreSQL's JDBC driver, in a Hive metastore's JVM) reach it through `tcp_port()`:
a relay on 127.0.0.1 that copies bytes to and from the server's socket, started once per server, stopped with it.
The server still authenticates each connection (a relayed one is a local connection to it).
"""

from __future__ import annotations

import contextlib
import pathlib
import select
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

PASSWORD = "right-password"
PASSWORD_ROLE = "laminar_pw"


@dataclass
class PgServer:
    server: object  # pgserver's PostgresServer
    socket_dir: str
    folder: str

    def url(self, database: str = "postgres", user: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@/{database}?host={self.socket_dir}"

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A new, empty database (its name), dropped after."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def tcp_port(self) -> int:
        """A port on 127.0.0.1 that reaches this server (see the module's docstring)."""
        if getattr(self, "_relay", None) is None:
            port = self.server.get_postmaster_info().port or 5432
            self._relay = _Relay(f"{self.socket_dir}/.s.PGSQL.{port}")
        return self._relay.port

    def stop(self) -> None:
        try:
            if getattr(self, "_relay", None) is not None:
                self._relay.stop()
            self.server.cleanup()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class _Relay:
    """127.0.0.1:<port> to a Unix socket, one thread per connection; `stop()` closes the listener and every
    connection. The tests' connections are few and short (a metastore JVM's pool, for one test)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: set[socket.socket] = set()
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, name="pg-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed by stop()
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            self.open |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream), name="pg-relay-conn", daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.stopped.is_set():
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (a, b):
                self.open.discard(sock)
                sock.close()

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        for sock in list(self.open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def start_postgres() -> PgServer:
    """Start a server whose data lives in a new folder of its own; `PgServer.stop` stops it and removes the
    folder (pgserver also stops it when the process exits). Run as root, pgserver runs the server as its own
    user and opens the folder's parents to it: a folder outside pytest's temporary root, which every pytest
    process that starts closes again (other test processes on the machine included)."""
    import pgserver
    import psycopg

    folder = pathlib.Path(tempfile.mkdtemp(prefix="laminar-pg-"))
    data = folder / "pgdata"
    server = pgserver.get_server(str(data), cleanup_mode="stop")
    pg = PgServer(server, str(data), str(folder))
    hba = data / "pg_hba.conf"
    hba.write_text(f"local all {PASSWORD_ROLE} scram-sha-256\n" + hba.read_text())
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
        conn.execute("SELECT pg_reload_conf()")
    return pg
