"""The Postgres target (psycopg 3): a table keyed by the export's key, kept equal to the source's Delta table,
exactly once.

One delivery is one transaction:

    lock the export                    pg_advisory_xact_lock: deliveries of one export queue behind each other
    check the delivered version        `laminar_exports` still holds what the delivery read, else it rolls back
    check or create the table          columns and key against the Delta schema, before anything is written
    FULL: TRUNCATE (DELETE where TRUNCATE is not the export's to use: `_empty`), COPY the table's rows in
    INCREMENTAL: COPY the deleted keys and the upserts into temporary tables; DELETE the deleted keys (and the
                 rows of replaced partitions); INSERT the upserts ... ON CONFLICT (key) DO UPDATE
    write the delivered version        UPDATE ... WHERE delivered_version = <the version read> (one row, else roll back)
    commit

So readers see the table before the delivery or after it, never between, and a crash anywhere (the
connection dropped: Postgres rolls back) leaves the old version with the old rows.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from laminar_assets.errors import ConcurrentDeliveryError, ExportError, ExportSchemaError, ExportTargetError

from ..spec.exports import PostgresExport
from .connections import Connection
from .protocol import Applied, Changes, Delivered, Mode, TargetContext

VERSIONS_TABLE = "laminar_exports"
_SIMPLE = {"string": "text", "long": "bigint", "integer": "integer", "short": "smallint", "byte": "smallint",
           "double": "double precision", "float": "real", "boolean": "boolean", "timestamp": "timestamp with time zone",
           "timestamp_ntz": "timestamp without time zone", "date": "date", "binary": "bytea"}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
CONNECT_SECONDS = 10
TRUNCATE_LOCK_SECONDS = 5  # how long a full resync waits for the table's readers before it DELETEs instead


def pg_type(delta_type) -> str | None:
    """The Postgres type of a Delta column type (JSON form): None when there is none."""
    if isinstance(delta_type, dict):
        return "jsonb" if delta_type.get("type") in ("array", "map", "struct") else None
    if delta_type in _SIMPLE:
        return _SIMPLE[delta_type]
    m = _DECIMAL.match(str(delta_type))
    return f"numeric({m.group(1)},{m.group(2)})" if m else None


def _shown(delta_type) -> str:
    return delta_type.get("type", "nested") if isinstance(delta_type, dict) else str(delta_type)


class PostgresTarget:
    """The target of a `PostgresExport` over one connection (opened on first use, closed by `close`)."""

    def __init__(self, export: PostgresExport, connection: Connection, context: TargetContext) -> None:
        self.export = export
        self.connection = connection
        self.context = context
        try:
            params = conninfo_to_dict(connection.url)
        except psycopg.ProgrammingError:
            raise ExportTargetError(f"export '{export.name}': connection '{connection.name}' is not a Postgres URL "
                                    f"({connection.safe_url}); expected postgresql://user@host:5432/database",
                                    export=export.name, connection=connection.name) from None
        self.params = params
        self.table = sql.Identifier(export.schema_name, export.table_name)
        self.versions = sql.Identifier(export.schema_name, VERSIONS_TABLE)
        self._conn: psycopg.Connection | None = None

    # --- where -------------------------------------------------------------------------
    def describe(self) -> str:
        p = self.params
        host = p.get("host") or p.get("hostaddr") or "localhost"
        return (f"Postgres table {self.export.schema_name}.{self.export.table_name} on host={host} "
                f"port={p.get('port') or 5432} database={p.get('dbname') or p.get('user') or '?'} user={p.get('user') or '?'}")

    def _where(self) -> dict:
        p = self.params
        return {"host": p.get("host") or p.get("hostaddr") or "localhost", "database": p.get("dbname"),
                "user": p.get("user"), "table": f"{self.export.schema_name}.{self.export.table_name}"}

    def _conn_(self) -> psycopg.Connection:
        if self._conn is None:
            password = self.connection.option("password")
            try:
                given: dict[str, Any] = {"password": password} if password else {}  # (connect's keywords are typed)
                self._conn = psycopg.connect(self.connection.url, autocommit=True, connect_timeout=CONNECT_SECONDS,
                                             application_name=f"laminar export {self.export.name}", **given)
            except psycopg.OperationalError as exc:
                raise self._connect_error(exc) from None
        return self._conn

    def _connect_error(self, exc: psycopg.OperationalError) -> ExportTargetError:
        text = " ".join(str(exc).split())
        where = self._where()
        user, at = where["user"] or "?", f"host={where['host']} database={where['database'] or '?'}"
        name = self.export.name
        if re.search(r"password authentication failed|no password supplied|authentication failed", text, re.I):
            return ExportTargetError(f"export '{name}': Postgres at {at} refused the credentials of user '{user}' "
                                     "(authentication failed); check the password of connection "
                                     f"'{self.connection.name}'", export=name, **where)
        if re.search(r'database "[^"]*" does not exist', text):
            return ExportTargetError(f"export '{name}': Postgres at host={where['host']} has no database "
                                     f"'{where['database']}'; create it or fix connection '{self.connection.name}'",
                                     export=name, **where)
        if re.search(r'role "[^"]*" does not exist', text):
            return ExportTargetError(f"export '{name}': Postgres at {at} has no user '{user}'; create the role or fix "
                                     f"connection '{self.connection.name}'", export=name, **where)
        cause = _reason(text)
        return ExportTargetError(f"export '{name}': cannot reach Postgres at {at} port={self.params.get('port') or 5432} "
                                 f"as user '{user}' ({cause}); is the server running and reachable?", export=name,
                                 retryable=True, **where)

    def _failure(self, exc: psycopg.Error, doing: str) -> ExportError:
        """One line for a failure while delivering: permissions named, nothing else guessed."""
        where = self._where()
        first = (getattr(exc.diag, "message_primary", None) or str(exc)).strip().splitlines()[0]
        name = self.export.name
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return ExportTargetError(f"export '{name}': Postgres user '{where['user']}' lacks a permission to {doing} "
                                     f"{where['table']} ({first}); grant it (e.g. GRANT USAGE, CREATE ON SCHEMA "
                                     f"{self.export.schema_name}, and INSERT, UPDATE, DELETE, SELECT on the table); "
                                     "nothing was written", export=name, **where)
        if isinstance(exc, psycopg.OperationalError):
            return ExportTargetError(f"export '{name}': the connection to Postgres at host={where['host']} database="
                                     f"{where['database']} was lost while it tried to {doing} {where['table']} "
                                     f"({first}); nothing was written", export=name, retryable=True, **where)
        return ExportError(f"export '{name}': Postgres refused to {doing} {where['table']}: {first}; nothing was "
                           "written", export=name, **where)

    # --- the protocol ------------------------------------------------------------------
    def delivered(self) -> Delivered | None:
        conn = self._conn_()
        try:
            with conn.transaction():
                if not self._exists(conn, self.versions):
                    return None
                row = conn.execute(sql.SQL("SELECT delivered_version, source_table_id, delivered_at, target_oid FROM {} "
                                           "WHERE export = %s").format(self.versions), (self.export.name,)).fetchone()
                if row is None:
                    return None
                version, table_id, at, oid = row
                now = self._oid(conn)
                changed = None
                if now is None:
                    changed = f"table {self.export.schema_name}.{self.export.table_name} is gone (dropped since version " \
                              f"{version} was delivered)"
                elif oid is not None and now != oid:
                    changed = f"table {self.export.schema_name}.{self.export.table_name} was recreated since version " \
                              f"{version} was delivered"
                return Delivered(int(version), table_id, at, changed, oid)
        except psycopg.Error as exc:
            raise self._failure(exc, "read the delivered version of") from None

    def apply(self, changes: Changes) -> Applied:
        conn = self._conn_()
        try:
            with conn.transaction():
                return self._apply(conn, changes)
        except psycopg.Error as exc:
            raise self._failure(exc, "write") from None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # --- one delivery ------------------------------------------------------------------
    def _apply(self, conn: psycopg.Connection, changes: Changes) -> Applied:
        name = self.export.name
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"laminar export {name}",))
        if not self._exists(conn, self.versions):
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"laminar exports {self.export.schema_name}",))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (export text PRIMARY KEY, source_table text NOT NULL, source_table_id "
                "text, delivered_version bigint NOT NULL, delivered_at timestamptz NOT NULL, target_table text NOT NULL, "
                "target_oid bigint, mode text, reason text, rows_upserted bigint, rows_deleted bigint)").format(self.versions))
        held = conn.execute(sql.SQL("SELECT delivered_version, source_table_id FROM {} WHERE export = %s FOR UPDATE")
                            .format(self.versions), (name,)).fetchone()
        expected = changes.expected
        if (held is None) != (expected is None) or (held is not None and expected is not None
                                                    and int(held[0]) != expected.version):
            raise ConcurrentDeliveryError(
                f"export '{name}': another delivery moved the delivered version of {self._where()['table']} to "
                f"{held[0] if held else 'none'} (this one read {expected.version if expected else 'none'}); this one "
                "rolled back, the next one delivers from there", export=name)
        columns = self._columns(changes)
        oid = self._oid(conn)
        created = oid is None
        if oid is None:
            self._create(conn, columns, changes.key)
            oid = self._oid(conn)
        else:
            self._check(conn, oid, columns, changes.key)
            if changes.mode is not Mode.FULL and expected is not None and expected.token is not None \
                    and oid != expected.token:
                raise ConcurrentDeliveryError(f"export '{name}': table {self._where()['table']} was recreated while "
                                              "this delivery ran; it rolled back, the next one delivers every row",
                                              export=name)
        names = [c for c, _ in columns]
        deleted = upserted = 0
        if changes.mode is Mode.FULL:
            deleted = 0 if created or oid is None else self._empty(conn, oid)  # (not created: the oid found)
            upserted = self._copy(conn, self.table, names, changes.rows, changes.schema)
        else:
            deleted = self._delete(conn, changes)
            upserted = self._upsert(conn, names, changes)
        self.context.hook("export_after_rows")
        self._record(conn, changes, held is not None, oid, upserted, deleted)
        self.context.hook("export_after_version")
        return Applied(rows_upserted=upserted, rows_deleted=deleted)

    def _columns(self, changes: Changes) -> list[tuple[str, str]]:
        """(name, Postgres type) of every column of the source table; a type Postgres cannot hold is refused."""
        out = []
        for f in changes.delta_fields:
            t = pg_type(f["type"])
            if t is None:
                raise ExportSchemaError(f"export '{self.export.name}': column '{f['name']}' of '{changes.source_table}' "
                                        f"has Delta type {_shown(f['type'])}, which has no Postgres type here; leave it "
                                        "out of the flow's output", export=self.export.name, column=f["name"])
            out.append((f["name"], t))
        return out

    def _create(self, conn: psycopg.Connection, columns: list[tuple[str, str]], key: tuple[str, ...]) -> None:
        body = [sql.SQL("{} {}{}").format(sql.Identifier(c), sql.SQL(t), sql.SQL(" NOT NULL" if c in key else ""))
                for c, t in columns]
        body.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(self.table, sql.SQL(", ").join(body)))

    def _check(self, conn: psycopg.Connection, oid: int, columns: list[tuple[str, str]], key: tuple[str, ...]) -> None:
        """Refuse a table whose columns or key do not match (before anything is written), naming the table, the
        column and both types."""
        table, name = self._where()["table"], self.export.name
        found = {r[0]: r[1:] for r in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()}
        fix = "alter the table, or drop it (Laminar creates it again and delivers every row); nothing was written"
        for column, wanted in columns:
            if column not in found:
                raise ExportSchemaError(f"export '{name}': Postgres table {table} has no column '{column}' (expected "
                                        f"{wanted}); {fix}", export=name, table=table, column=column)
            if found[column][0] != wanted:
                raise ExportSchemaError(f"export '{name}': column '{column}' of Postgres table {table} is "
                                        f"{found[column][0]}, expected {wanted}; {fix}", export=name, table=table,
                                        column=column)
        ours = {c for c, _ in columns}
        for column, (kind, not_null, has_default) in found.items():
            if column not in ours and not_null and not has_default:
                raise ExportSchemaError(f"export '{name}': column '{column}' of Postgres table {table} ({kind}) is NOT "
                                        f"NULL without a default, and the source has no such column; {fix}",
                                        export=name, table=table, column=column)
        unique = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) AS k(attnum) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indrelid = %s "
            "AND (i.indisprimary OR i.indisunique) AND i.indpred IS NULL GROUP BY i.indexrelid", (oid,)).fetchall()
        if not any(set(r[0]) == set(key) for r in unique):
            raise ExportSchemaError(f"export '{name}': Postgres table {table} has no primary key or unique index on "
                                    f"({', '.join(key)}), the export's key; add one (ALTER TABLE {table} ADD PRIMARY KEY "
                                    f"({', '.join(key)})), or drop the table; nothing was written", export=name,
                                    table=table)

    def _empty(self, conn: psycopg.Connection, oid: int) -> int:
        """Remove every row of the table for a full resync, in the delivery's transaction; returns the rows removed.

        TRUNCATE where the export owns the whole table: it gives the table a new, empty file, so the resync leaves
        no dead rows behind (a DELETE of a million rows leaves a million dead ones, and a table twice its size,
        until a vacuum) and is rolled back with the rest of the delivery like any statement. DELETE instead where a
        TRUNCATE would do something else than remove the rows: the user may not TRUNCATE (DELETE is the privilege
        the export documents), another table's foreign key references it (TRUNCATE fails), a trigger or a
        row-level security policy expects to see each deleted row, it has partitions or children; or a reader
        holds the table for longer than `TRUNCATE_LOCK_SECONDS` (TRUNCATE waits for the readers of the table and
        makes new ones wait behind it: a long report would hold the delivery, and every reader, up)."""
        owned = _value(conn.execute(
            "SELECT has_table_privilege(%(oid)s::oid, 'TRUNCATE') "
            "AND (SELECT relkind = 'r' AND NOT relhassubclass FROM pg_class WHERE oid = %(oid)s) "  # no descendants
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE confrelid = %(oid)s AND conrelid <> %(oid)s "
            "AND contype = 'f') "
            "AND NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %(oid)s AND NOT tgisinternal "
            "AND tgtype & 8 <> 0) "  # a DELETE trigger
            "AND NOT (SELECT relrowsecurity FROM pg_class WHERE oid = %(oid)s)", {"oid": oid}))
        if owned and self._lock(conn):
            rows = _value(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self.table)))
            conn.execute(sql.SQL("TRUNCATE ONLY {}").format(self.table))
            return int(rows)
        return conn.execute(sql.SQL("DELETE FROM {}").format(self.table)).rowcount

    def _lock(self, conn: psycopg.Connection) -> bool:
        """Take the table's ACCESS EXCLUSIVE lock (TRUNCATE's) for the rest of the transaction, waiting at most
        `TRUNCATE_LOCK_SECONDS` for its readers; False when they held it longer (nothing is locked then)."""
        previous = _value(conn.execute("SELECT current_setting('lock_timeout')"))
        try:
            with conn.transaction():  # a savepoint: a lock that timed out rolls back to here, not the delivery
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(TRUNCATE_LOCK_SECONDS * 1000)}ms",))
                conn.execute(sql.SQL("LOCK TABLE ONLY {} IN ACCESS EXCLUSIVE MODE").format(self.table))
        except psycopg.errors.LockNotAvailable:
            return False
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
        return True

    def _delete(self, conn: psycopg.Connection, changes: Changes) -> int:
        deleted = 0
        key = list(changes.key)
        if changes.deletes is not None and changes.deletes.num_rows:
            temp = sql.Identifier("laminar_deleted")
            conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
                temp, sql.SQL(", ").join(map(sql.Identifier, key)), self.table))
            self._copy(conn, temp, key, changes.deletes.to_batches(max_chunksize=self.export.batch_rows),
                       changes.deletes.schema)
            match = sql.SQL(" AND ").join(sql.SQL("t.{0} = d.{0}").format(sql.Identifier(k)) for k in key)
            deleted += conn.execute(sql.SQL("DELETE FROM {} AS t USING {} AS d WHERE {}").format(
                self.table, temp, match)).rowcount
        column = sql.Identifier(changes.time_column) if changes.time_column else None
        naive = any(f["name"] == changes.time_column and f["type"] == "timestamp_ntz" for f in changes.delta_fields)
        for r in changes.replace:
            lo, hi = (r.start.replace(tzinfo=None), r.end.replace(tzinfo=None)) if naive else (r.start, r.end)
            deleted += conn.execute(sql.SQL("DELETE FROM {} WHERE {} >= %s AND {} < %s").format(self.table, column, column),
                                    (lo, hi)).rowcount
        return deleted

    def _upsert(self, conn: psycopg.Connection, names: list[str], changes: Changes) -> int:
        """INSERT the rows ... ON CONFLICT (key) DO UPDATE; returns the rows inserted or changed."""
        temp = sql.Identifier("laminar_upserts")
        conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            temp, sql.SQL(", ").join(map(sql.Identifier, names)), self.table))
        copied = self._copy(conn, temp, names, changes.rows, changes.schema)
        if not copied:
            return 0
        cols = sql.SQL(", ").join(map(sql.Identifier, names))
        rest = [c for c in names if c not in changes.key]
        if rest:
            assign = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest)
            changed = sql.SQL("({}) IS DISTINCT FROM ({})").format(
                sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in rest),
                sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(c)) for c in rest))
            action: sql.Composable = sql.SQL("DO UPDATE SET {} WHERE {}").format(assign, changed)
        else:
            action = sql.SQL("DO NOTHING")
        query = sql.SQL("INSERT INTO {} AS t ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
            self.table, cols, cols, temp, sql.SQL(", ").join(map(sql.Identifier, changes.key)), action)
        return conn.execute(query).rowcount  # rows inserted or changed (an equal row is left as it is)

    def _record(self, conn: psycopg.Connection, changes: Changes, exists: bool, oid: int | None, upserted: int,
                deleted: int) -> None:
        values = dict(source_table=changes.source_table, source_table_id=changes.source_table_id,
                      delivered_version=changes.version, target_table=self._where()["table"], target_oid=oid,
                      mode=changes.mode.value, reason=changes.reason.value, rows_upserted=upserted, rows_deleted=deleted)
        if exists:
            assert changes.expected is not None  # a version was held: _apply refused a delivery that expected none
            assign = sql.SQL(", ").join(sql.SQL("{} = %({})s").format(sql.Identifier(k), sql.SQL(k)) for k in values)
            done = conn.execute(sql.SQL("UPDATE {} SET {}, delivered_at = now() WHERE export = %(export)s AND "
                                        "delivered_version = %(expected)s").format(self.versions, assign),
                                {**values, "export": self.export.name, "expected": changes.expected.version}).rowcount
            if done != 1:
                raise ConcurrentDeliveryError(f"export '{self.export.name}': its delivered version moved while this "
                                              "delivery ran; it rolled back", export=self.export.name)
        else:
            names = ["export", *values, "delivered_at"]
            conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({}, now())").format(
                self.versions, sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join(sql.Placeholder(k) for k in ["export", *values])),
                {**values, "export": self.export.name})

    def _copy(self, conn: psycopg.Connection, table: sql.Composable, names: list[str], batches: Iterable[pa.RecordBatch],
              schema: pa.Schema) -> int:
        """COPY the batches into `table` as CSV written by Arrow: no row becomes Python objects, except values
        Postgres takes as text of another form (bytea, jsonb)."""
        rows = 0
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table, sql.SQL(", ").join(map(sql.Identifier, names)))
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for batch in batches:
                if not batch.num_rows:
                    continue
                buffer = io.BytesIO()
                pcsv.write_csv(_csv_ready(batch.select(names)), buffer, pcsv.WriteOptions(include_header=False))
                copy.write(buffer.getbuffer())
                rows += batch.num_rows
        return rows

    @staticmethod
    def _exists(conn: psycopg.Connection, name: sql.Identifier) -> bool:
        return _value(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name.as_string(conn),)))

    def _oid(self, conn: psycopg.Connection) -> int | None:
        row = conn.execute("SELECT to_regclass(%s)::oid::bigint", (self.table.as_string(conn),)).fetchone()
        return int(row[0]) if row and row[0] is not None else None


def _value(cursor: psycopg.Cursor) -> Any:
    """The first value of the one row `cursor`'s query returns (an aggregate, a function, a setting)."""
    row = cursor.fetchone()
    assert row is not None  # such a query always returns a row
    return row[0]


def _csv_ready(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the columns Arrow's CSV writer cannot write as Postgres reads them made text: binary as
    bytea's hex form, nested values as JSON."""
    columns, fields = [], []
    for f, column in zip(batch.schema, batch.columns):
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or pa.types.is_fixed_size_binary(f.type):
            column = pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())
        elif pa.types.is_nested(f.type):
            column = pa.array([None if v is None else json.dumps(_jsonable(v, f.type)) for v in column.to_pylist()],
                              pa.string())
        columns.append(column)
        fields.append(pa.field(f.name, column.type))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def _jsonable(value, kind: pa.DataType | None = None):
    if kind is not None and pa.types.is_map(kind):
        return {str(k): _jsonable(v, kind.item_type) for k, v in value}
    if isinstance(value, dict):
        child = {f.name: f.type for f in kind} if kind is not None and pa.types.is_struct(kind) else {}
        return {k: _jsonable(v, child.get(k)) for k, v in value.items()}
    if isinstance(value, list):
        item = kind.value_type if kind is not None and hasattr(kind, "value_type") else None
        return [_jsonable(v, item) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and value != value:
        return None
    return value


def _reason(text: str) -> str:
    """The cause in libpq's message of a failed connection: 'Connection refused', 'No such file or directory', ..."""
    found = re.search(r".*failed: (.+?)(?: Is the server|$)", text)  # the last "failed: ...": libpq's cause
    return (found.group(1) if found else text).strip().rstrip(".")
