"""A throwaway PostgreSQL server for tests: pgserver's bundled binaries, listening on a Unix socket only (no TCP
port), one per test process (the session fixture `pg_server` in tests/conftest.py), a database of its own per test.

Besides the superuser, the server has `laminar_pw`, the one role that must give a password (scram-sha-256; its
password is `PASSWORD`), so a wrong one is refused as on a real server.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
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

    def stop(self) -> None:
        try:
            self.server.cleanup()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


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
