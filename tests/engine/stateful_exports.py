"""Exports in the random stateful test (issue #61): the rules and invariants `LakeMachine` (and `StageLakeMachine`,
whose corrections refill the stage's keys, then deliver) gains when the test gives it a Postgres server and a Redis
server (`LakeMachine.pg_server`, `LakeMachine.redis_server`).

Some specs of an example get a `PostgresExport` (a table in a schema of the example's own, dropped at its end)
and/or a `RedisExport` (the server's database emptied when the example starts). What users, operators and the
scheduler do with them:

- the scheduler: after a spec's run, its exports deliver (the pipeline sensor's run delivers them after the
  spec; after a run by hand, the sensor starts a run of the export left behind);
- a delivery alone, a backfill of partitions, a forced full resync (by hand);
- a delivery killed at any of its steps (`EXPORT_STEPS`), nothing more written; a Redis delivery killed while
  writing leaves its mark, which keeps other deliveries out until its lease runs out (a rule: time passes);
- a target edited by hand: a Postgres row changed, deleted or added, the table truncated or dropped; a Redis
  key's field changed or the key deleted. The design says a full resync repairs them all (a dropped table on
  the next delivery, TARGET_CHANGED) and a backfill of a partition repairs that partition's rows; until then
  the edited keys are left out of the comparison;
- a Postgres table that lacks a column the sink gained (the stage keeps the source's new column): the delivery
  is refused before writing, naming the column; the operator alters or drops the table and delivers again.

With a webhook receiver too (`LakeMachine.webhook_receiver`), every spec with an export also gets a
`WebhookExport`, checked after every step as tests/engine/stateful_webhooks.py says.

After every step, for every export: the version its target holds never exceeds the sink's version nor goes
backwards, the lake's record is never ahead of it, and the target equals the sink at that version: the
Postgres table row for row, each Redis key the sink's latest row of that key (while a killed Redis delivery's
mark is there, a key may instead hold the row of the version it was writing, stamped with that version).
At the end (teardown), every export delivered again (a full resync where the target was edited) has caught up
with its sink's latest version and equals it.

The comparisons read the sink with `deltalake` alone and compute a key's latest row in plain Python: no code
shared with the export's implementation.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from laminar_assets import storage
from laminar_assets.engine import PostgresExport, RedisExport
from laminar_assets.engine.export import EXPORT_STEPS, Connection, Exporter, load_record
from laminar_assets.engine.spec.exports import export_key
from laminar_assets.errors import ConcurrentDeliveryError, ExportSchemaError, InjectedCrash
from tests.engine import stateful_webhooks as hooks

PARTITIONS = ("2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00")  # the lake's (stateful_lake.py)
STATE = "laminar:exports:"  # + an export's name: the Redis hash of its delivered version (docs/exports.md)
# which targets each spec of an example gets (zipped with the example's specs)
export_plans = st.lists(st.sampled_from(("pg", "redis", "both", None)), min_size=3, max_size=3)
deliveries = st.sampled_from(["changes", "changes", "partitions", "full"])
pg_edits = st.sampled_from(["update", "delete", "insert", "truncate", "drop"])
redis_edits = st.sampled_from(["field", "delete"])
EVERY_KEY = "*"  # an edit that touched every key (a truncate)


class Target:
    """One export of the example: its spec, its source spec and what the machine knows of it."""

    def __init__(self, export, source) -> None:
        self.export, self.source = export, source
        self.highest: int | None = None  # the highest delivered version seen
        self.edited: set = set()  # keys edited by hand since the last repair (EVERY_KEY: all)
        self.dropped = False  # the Postgres table dropped by hand
        # a webhook's: the receiver's request number where the last full delivery began, where the last delivery
        # began, the version delivered before it, and whether a delivery was killed before it recorded
        self.mark = self.started = 0
        self.before: int | None = None
        self.unconfirmed = False

    @property
    def kind(self) -> str:
        return self.export.kind


class ExportRules:
    """The export rules and invariants of `LakeMachine` (a mixin: see the module docstring)."""

    pg_server = None  # a tests.postgres.PgServer (set by the test; None: no exports)
    redis_server = None  # a tests.redis_server.RedisServer
    webhook_receiver = None  # a tests.engine.export.receiver.Receiver

    def _create_exports(self, plans) -> None:
        self.targets: list[Target] = []
        self.pg_schema = None
        self.sink_rows: dict[tuple[str, int], list[dict]] = {}  # (sink, version) -> its rows, read once
        self._pg_conn = self._redis_client = None
        connections = {}
        for spec, plan in zip(self.specs, plans or ()):
            if plan in ("pg", "both") and self.pg_server is not None:
                if self.pg_schema is None:
                    self.pg_schema = f"s_{uuid.uuid4().hex[:12]}"
                    self._pg(f'CREATE SCHEMA "{self.pg_schema}"')
                    connections["pg"] = Connection("pg", self.pg_server.url())
                self.targets.append(Target(PostgresExport(name=f"{spec.name}_pg", source=spec.name, connection="pg",
                                                          table=f"{self.pg_schema}.{spec.name}", batch_rows=3), spec))
            if plan in ("redis", "both") and self.redis_server is not None:
                if "cache" not in connections:
                    self._redis().flushdb()
                    connections["cache"] = Connection("cache", self.redis_server.url())
                self.targets.append(Target(RedisExport(name=f"{spec.name}_cache", source=spec.name, connection="cache",
                                                       key_prefix=spec.name, batch_rows=2), spec))
            if plan is not None and self.webhook_receiver is not None:
                if hooks.CONNECTION not in connections:
                    self.webhook_receiver.clear()
                export, connections[hooks.CONNECTION] = hooks.webhook_export(spec, self.webhook_receiver)
                self.targets.append(Target(export, spec))
        self.connections = connections

    def _drop_exports(self) -> None:
        """The example's Postgres schema dropped, its connections closed."""
        try:
            if getattr(self, "pg_schema", None) is not None:
                self._pg(f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE')
        finally:
            for conn in (getattr(self, "_pg_conn", None), getattr(self, "_redis_client", None)):
                if conn is not None:
                    conn.close()

    # --- what the scheduler, users and operators do with exports ------------------------------
    def _deliver_exports_of(self, data, spec) -> None:
        """After a run of `spec`, its exports deliver (LakeMachine.run)."""
        for target in getattr(self, "targets", ()):
            if target.source.name == spec.name:
                self._deliver(data, target)

    @precondition(lambda self: getattr(self, "targets", None))
    @rule(data=st.data(), how=deliveries)
    def deliver(self, data, how):
        """A delivery alone (asked for by hand, or a tick where only the export is behind): every change since
        the delivered version, plus, for a backfill, the rows of some partitions replaced; or a full resync."""
        self._deliver(data, self._target(data), how)

    @precondition(lambda self: getattr(self, "targets", None))
    @rule(data=st.data(), how=deliveries, step=st.sampled_from(EXPORT_STEPS))
    def kill_delivery(self, data, how, step):
        """A delivery killed at `step`: nothing more is written (Postgres rolls the open transaction back when the
        connection drops; a Redis delivery leaves its mark and the keys it wrote)."""
        target = self._target(data)

        def hook(at: str) -> None:
            if at == step:
                raise InjectedCrash(f"delivery killed at {step}")

        try:
            self._deliver(data, target, how, hook=hook)
        except InjectedCrash:
            if target.kind == "webhook":
                hooks.killed(self.webhook_receiver, self.root, target, how, self._sink_at)
            elif target.dropped and self._pg("SELECT to_regclass(%s) IS NOT NULL", (self._pg_table(target),))[0][0]:
                target.dropped = False  # the delivery committed (a full one, TARGET_CHANGED) before it was killed

    @precondition(lambda self: any(t.kind == "redis" for t in getattr(self, "targets", ())))
    @rule()
    def lease_runs_out(self):
        """Time passes: a killed Redis delivery's lease (60 s) is over, so the next delivery takes over."""
        for target in self.targets:
            state = STATE + target.export.name
            if target.kind == "redis" and self._redis().hget(state, "pending"):
                self._redis().hset(state, "lease_until", "0")

    @precondition(lambda self: any(t.kind == "postgres" for t in getattr(self, "targets", ())))
    @rule(data=st.data(), edit=pg_edits)
    def edit_postgres_table(self, data, edit):
        """Someone edits the Postgres table by hand (docs/exports.md: do not; a backfill or a full resync puts the
        rows back, a dropped table is delivered again whole)."""
        target = self._target(data, "postgres")
        table = self._pg_table(target)
        if target.dropped or not self._pg("SELECT to_regclass(%s) IS NOT NULL", (table,))[0][0]:
            return
        key = list(export_key(target.source))
        if edit == "drop":
            self._pg(f"DROP TABLE {table}")
            target.dropped, target.edited = True, set()
        elif edit == "truncate":
            self._pg(f"TRUNCATE {table}")
            target.edited.add(EVERY_KEY)
        elif edit == "insert":  # a row of a window no partition holds: only a full resync removes it
            values = {"window_start": datetime(2000, 1, 1, tzinfo=UTC), "window_end": datetime(2000, 1, 1, tzinfo=UTC),
                      "ts": datetime(2000, 1, 1, tzinfo=UTC), "id": -1, "sym": "z", "venue": "Z", "account": "z"}
            self._pg(f"INSERT INTO {table} ({', '.join(key)}) VALUES ({', '.join(['%s'] * len(key))}) "
                     "ON CONFLICT DO NOTHING", tuple(values[k] for k in key))
            target.edited.add(tuple(_norm(values[k]) for k in key))
        else:
            rows = self._pg(f"SELECT {', '.join(key)} FROM {table} ORDER BY {', '.join(key)}")
            if not rows:
                return
            row = rows[data.draw(st.integers(0, len(rows) - 1))]
            where = " AND ".join(f"{k} = %s" for k in key)
            if edit == "delete":
                self._pg(f"DELETE FROM {table} WHERE {where}", row)
            else:
                column = next(c for c in self._pg_columns(target) if c not in key)
                self._pg(f"UPDATE {table} SET {column} = NULL WHERE {where}", row)
            target.edited.add(tuple(_norm(v) for v in row))

    @precondition(lambda self: any(t.kind == "redis" for t in getattr(self, "targets", ())))
    @rule(data=st.data(), edit=redis_edits)
    def edit_redis_key(self, data, edit):
        """Someone edits a key of a Redis export by hand: a field changed, or the key deleted (a full resync puts
        it back)."""
        target = self._target(data, "redis")
        client = self._redis()
        keys = sorted(client.scan_iter(match=f"{target.export.key_prefix}:*"))
        if not keys:
            return
        key = keys[data.draw(st.integers(0, len(keys) - 1))]
        if edit == "delete":
            client.delete(key)
        else:
            column = next(c for c in sorted(client.hkeys(key)) if c not in (*target.source.key_columns, "_laminar_version"))
            client.hset(key, column, "edited")
        target.edited.add(key)

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def every_export_equals_its_sink_at_the_delivered_version(self):
        for target in getattr(self, "targets", ()):
            self._check_target(target)

    def _check_target(self, target: Target, *, caught_up: bool = False) -> None:
        name = target.export.name
        uri = self._sink_uri(target)
        latest = DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else None
        if target.kind == "postgres":
            delivered, pending = self._pg_delivered(target), None
        elif target.kind == "webhook":
            delivered, pending = hooks.delivered(self.root, name), None
        else:
            delivered, pending = self._redis_delivered(target)
        where = f"export {name}: delivered version {delivered} (pending {pending}), sink at version {latest}"
        for v in (delivered, pending):
            assert v is None or (latest is not None and v <= latest), f"{where}: ahead of its sink"
        assert delivered is not None or target.highest is None, f"{where}: lost the delivered {target.highest}"
        assert target.highest is None or delivered >= target.highest, f"{where}: went back from {target.highest}"
        target.highest = delivered
        record = load_record(self.root, name)
        if record is not None and record.delivered_version is not None:
            assert delivered is not None and record.delivered_version <= delivered, \
                f"{where}: the lake's record says {record.delivered_version}"
        if caught_up:
            assert delivered == latest and pending is None, f"{where}: not caught up"
        if target.kind == "postgres":
            self._check_postgres(target, delivered, where)
        elif target.kind == "webhook":
            hooks.check(self.webhook_receiver, target, delivered, *self._sink_at(target, delivered), where)
        else:
            self._check_redis(target, delivered, pending, where)

    def _check_postgres(self, target: Target, delivered: int | None, where: str) -> None:
        table = self._pg_table(target)
        exists = self._pg("SELECT to_regclass(%s) IS NOT NULL", (table,))[0][0]
        if delivered is None:
            assert not exists, f"{where}: the table {table} exists without a delivered version"
            return
        if target.dropped:
            assert not exists, f"{where}: {table} came back without a delivery"
            return
        assert exists, f"{where}: {table} is gone"
        rows = self._rows_at(target, delivered)
        columns = [f.name for f in self._schema_at(target, delivered)]
        key = export_key(target.source)
        at = [columns.index(k) for k in key]
        held = self._pg(f"SELECT {', '.join(columns)} FROM {table}")
        want = Counter(tuple(_norm(r[c]) for c in columns) for r in rows)
        got = Counter(tuple(_norm(v) for v in r) for r in held)
        if target.edited:
            def kept(row):
                return EVERY_KEY not in target.edited and tuple(row[i] for i in at) not in target.edited
            want, got = Counter({r: n for r, n in want.items() if kept(r)}), Counter({r: n for r, n in got.items() if kept(r)})
        assert got == want, (f"{where}: {table} differs from the sink at version {delivered}: missing "
                             f"{sorted(want - got, key=repr)}, extra {sorted(got - want, key=repr)}")

    def _check_redis(self, target: Target, delivered: int | None, pending: int | None, where: str) -> None:
        prefix = target.export.key_prefix
        client = self._redis()
        held = {k: client.hgetall(k) for k in client.scan_iter(match=f"{prefix}:*")}
        before = self._latest_at(target, delivered) if delivered is not None else {}
        after = self._latest_at(target, pending) if pending is not None else {}
        types = {f.name: f.type for f in self._schema_at(target, pending if pending is not None else delivered)} \
            if (delivered, pending) != (None, None) else {}
        for key in sorted(set(held) | set(before)):
            if key in target.edited:
                continue
            if key not in held:
                assert pending is not None and key not in after, \
                    f"{where}: key {key} is missing; the sink's latest row of it is {before[key]}"
                continue
            fields = dict(held[key])
            stamp = int(fields.pop("_laminar_version"))
            row = {c: _parse(v, types[c]) for c, v in fields.items()}
            if key in before and row in before[key] and stamp <= delivered:
                continue
            assert pending is not None and stamp == pending and row in after.get(key, ()), \
                (f"{where}: key {key} holds {row} stamped {stamp}; the sink's latest row(s) of it: "
                 f"{before.get(key)} at {delivered}, {after.get(key)} at {pending}")

    # --- helpers --------------------------------------------------------------------------------
    def _target(self, data, kind: str | None = None) -> Target:
        choices = [t for t in self.targets if kind is None or t.kind == kind]
        return choices[data.draw(st.integers(0, len(choices) - 1))]

    def _exporter(self, hook=None) -> Exporter:
        return Exporter(self.root, connections=self.connections, hook=hook)

    def _deliver(self, data, target: Target, how: str = "changes", hook=None):
        """One delivery as users and the scheduler ask for it, and what it must answer: the sink's latest version
        delivered; refused only while a killed Redis delivery's lease runs, or (Postgres) when the table lacks a
        column the sink gained, which the operator then adds or drops the table, and delivers again."""
        partitions = ()
        if how == "partitions":
            partitions = data.draw(st.lists(st.sampled_from(PARTITIONS),
                                            min_size=1, max_size=2, unique=True))
        must_resync = target.dropped or (target.kind == "redis" and self._redis_delivered(target)[1] is not None)
        if target.kind == "webhook":
            target.started = len(self.webhook_receiver.received)
            target.before = hooks.delivered(self.root, target.export.name)
        try:
            result = self._exporter(hook).deliver(target.export, target.source, partitions=partitions,
                                                  full=how == "full")
        except ConcurrentDeliveryError as exc:  # a killed delivery's mark, its lease not over
            assert target.kind == "redis" and self._redis_delivered(target)[1] is not None, exc
            return None
        except ExportSchemaError as exc:
            added = [c for c in self._schema_at(target, DeltaTable(self._sink_uri(target)).version()).names
                     if c not in self._pg_columns(target)]
            # a column the sink's table now holds under another type (a stage that ran over a text `px`, then
            # over a double): refused, naming both types; the operator drops the table, as the message says
            retyped = re.search(r"column '\w+' of Postgres table \S+ is .+, expected .+; alter the table, or drop it",
                                str(exc))
            assert target.kind == "postgres" and (retyped or added and f"no column '{added[0]}'" in str(exc)), exc
            if retyped or data.draw(st.booleans(), label="drop the table (else alter it)"):
                self._pg(f"DROP TABLE {self._pg_table(target)}")
                target.dropped, target.edited = True, set()
            else:
                self._pg(f"ALTER TABLE {self._pg_table(target)} ADD COLUMN {added[0]} text")
            return self._deliver(data, target, how, hook)
        if result.to_version is None:  # the spec has not written its table yet
            assert result.reason.value == "SOURCE_NOT_WRITTEN", result
            return result
        assert result.delivered_version == DeltaTable(self._sink_uri(target)).version(), result
        if must_resync:
            resyncs = ("TARGET_CHANGED", "FORCED_BY_USER", "NO_DELIVERED_VERSION")
            assert result.mode.value == "FULL" and result.reason.value in resyncs, \
                f"{target.export.name}: {result.mode.value} {result.reason.value} after its target was lost: {result.detail}"
        if target.kind == "webhook":
            if result.mode.value == "FULL":  # every row again, under new keys: a receiver starts from here
                target.mark = target.started
            target.unconfirmed = False
        self._repaired(target, how if result.mode.value != "FULL" else "full", partitions)
        return result

    def _repaired(self, target: Target, how: str, partitions=()) -> None:
        """What a delivery that committed puts back of what was edited by hand: everything after a full resync,
        the rows (Postgres) or keys with rows (Redis) of the partitions a backfill replaced."""
        if how == "full":
            target.edited, target.dropped = set(), False
        elif partitions and target.edited and EVERY_KEY not in target.edited:
            starts = {datetime.strptime(p, "%Y-%m-%d-%H:%M").replace(tzinfo=UTC) for p in partitions}
            column = target.source.output_time_column
            rows = self._rows_at(target, DeltaTable(self._sink_uri(target)).version())
            if target.kind == "postgres":
                at = export_key(target.source).index(column)
                target.edited = {k for k in target.edited
                                 if k[at].replace(minute=0, second=0, microsecond=0) not in starts}
            else:
                touched = {self._redis_key(target, r) for r in rows
                           if r[column].replace(minute=0, second=0, microsecond=0) in starts}
                target.edited -= touched
        target.dropped = False

    def _sink_uri(self, target: Target) -> str:
        return storage.join(self.root, target.source.sink)

    def _rows_at(self, target: Target, version: int) -> list[dict]:
        """The sink's rows at `version` (read once: read right after the step that delivered it)."""
        key = (target.source.sink, version)
        if key not in self.sink_rows:
            self.sink_rows[key] = DeltaTable(self._sink_uri(target), version=version).to_pyarrow_table().to_pylist()
        return self.sink_rows[key]

    def _sink_at(self, target: Target, version: int | None) -> tuple[list[dict] | None, pa.Schema | None]:
        return (None, None) if version is None else (self._rows_at(target, version), self._schema_at(target, version))

    def _schema_at(self, target: Target, version: int) -> pa.Schema:
        return pa.schema(DeltaTable(self._sink_uri(target), version=version).schema().to_arrow())

    def _latest_at(self, target: Target, version: int) -> dict[str, list[dict]]:
        """Per Redis key, the sink's rows of its latest time at `version` (more than one on a tie), NULLs left out."""
        column = target.source.output_time_column
        best: dict[str, tuple] = {}
        for row in self._rows_at(target, version):
            key = self._redis_key(target, row)
            if key not in best or row[column] > best[key][0]:
                best[key] = (row[column], [])
            if row[column] == best[key][0]:
                best[key][1].append({c: v for c, v in row.items() if v is not None})
        return {k: rows for k, (_, rows) in best.items()}

    @staticmethod
    def _redis_key(target: Target, row: dict) -> str:
        parts = ["\\N" if row[c] is None else str(row[c]).replace("\\", "\\\\").replace(":", "\\:")
                 for c in target.source.key_columns]
        return ":".join([target.export.key_prefix, *parts])

    def _redis_delivered(self, target: Target) -> tuple[int | None, int | None]:
        state = self._redis().hgetall(STATE + target.export.name)
        version = int(state["version"]) if "version" in state else None
        pending = int(state["pending_version"]) if state.get("pending") else None
        return version, pending

    def _pg_table(self, target: Target) -> str:
        return f"{self.pg_schema}.{target.source.name}"

    def _pg_delivered(self, target: Target) -> int | None:
        if not self._pg("SELECT to_regclass(%s) IS NOT NULL", (f"{self.pg_schema}.laminar_exports",))[0][0]:
            return None
        row = self._pg(f"SELECT delivered_version FROM {self.pg_schema}.laminar_exports WHERE export = %s",
                       (target.export.name,))
        return row[0][0] if row else None

    def _pg_columns(self, target: Target) -> list[str]:
        return [r[0] for r in self._pg("SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                                       "table_name = %s ORDER BY ordinal_position", (self.pg_schema, target.source.name))]

    def _pg(self, statement: str, params=None) -> list[tuple]:
        """Run one statement on the example's own connection (autocommit)."""
        import psycopg

        if self._pg_conn is None:
            self._pg_conn = psycopg.connect(self.pg_server.url(), autocommit=True)
        cur = self._pg_conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def _redis(self):
        if self._redis_client is None:
            self._redis_client = self.redis_server.client()
        return self._redis_client

    def _deliver_exports(self) -> None:
        """Every export delivered once more (teardown, before the specs catch up), after a killed delivery's lease."""
        if any(t.kind == "redis" for t in getattr(self, "targets", ())):
            self.lease_runs_out()
        for target in getattr(self, "targets", ()):
            self._deliver(_NoDraws(), target)

    def _catch_up_exports(self) -> None:
        """Liveness: every export, delivered again (a full resync where its target was edited by hand, and after a
        killed delivery's lease ran out), holds its sink's latest version and equals it."""
        if not getattr(self, "targets", None):
            return
        if any(t.kind == "redis" for t in self.targets):
            self.lease_runs_out()
        caught_up = {s.name for s in self.caught_up}
        for target in self.targets:
            if target.source.name not in caught_up:  # never run: `_deliver_exports` found its sink unwritten
                continue
            how = "full" if target.edited else "changes"
            for _ in range(2):  # a second one only after a table altered for a new column
                result = self._deliver(_NoDraws(), target, how)
                if result is not None and result.delivered_version == DeltaTable(self._sink_uri(target)).version():
                    break
            self._check_target(target, caught_up=True)


class _NoDraws:
    """What `_deliver` draws from in teardown, where Hypothesis draws nothing: alter a table (never drop it)."""

    def draw(self, strategy, label=None):
        return False


def _norm(value):
    """A value as both sides compare it: timestamps in UTC, NaN as text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _parse(text: str, kind: pa.DataType):
    """A Redis field's text as a value of the sink's column type (docs/exports.md: what a hash holds)."""
    if pa.types.is_timestamp(kind):
        return datetime.fromisoformat(text)
    if pa.types.is_integer(kind):
        return int(text)
    if pa.types.is_floating(kind):
        return float(text)
    if pa.types.is_boolean(kind):
        return {"true": True, "false": False}[text]
    return text
