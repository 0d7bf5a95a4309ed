"""Sinks written the way Laminar's flows and stages write theirs (replacing a partition's rows, deleting and
updating with change data), and the comparisons every export test makes: the Postgres table against the Delta
table, row for row. No Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Agg, Connection, Exporter, FlowSpec, PostgresExport, StageSpec, Tumbling
from laminar_assets.engine.delta.arrow_reads import read_arrow

FLOW = FlowSpec(name="m1", source="raw", event_time="ts", window=Tumbling("1m"), keys=("sym",),
                aggregates=(Agg.count(name="n"), Agg.sum("px", name="total")))
EXPORT = PostgresExport(name="m1_pg", source="m1", connection="pg", table="m1", batch_rows=3)
STAGE = StageSpec(name="st", source="raw", event_time="ts", dedup_key=("id",))
DAY = datetime(2024, 1, 2, tzinfo=UTC)
CDF = {"delta.enableChangeDataFeed": "true"}


def minute(hour: int, m: int) -> datetime:
    return DAY + timedelta(hours=hour, minutes=m)


def flow_rows(rows) -> pa.Table:
    """(hour, minute, sym, n, total) -> the sink rows of FLOW."""
    starts = [minute(h, m) for h, m, *_ in rows]
    return pa.table({
        "window_start": pa.array(starts, pa.timestamp("us", "UTC")),
        "window_end": pa.array([s + timedelta(minutes=1) for s in starts], pa.timestamp("us", "UTC")),
        "sym": pa.array([r[2] for r in rows], pa.string()),
        "n": pa.array([r[3] for r in rows], pa.int64()),
        "total": pa.array([r[4] for r in rows], pa.float64()),
    })


class Sink:
    """The Delta table of a flow or stage under a lake root."""

    def __init__(self, root: str, name: str) -> None:
        self.uri = f"{root}/{name}"

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri)

    def replace_hour(self, hour: int, rows: pa.Table) -> None:
        """Replace the rows of one hourly partition (as a flow's run does; with change data, like a stage's)."""
        lo, hi = minute(hour, 0), minute(hour + 1, 0)
        if not self.exists():
            write_deltalake(self.uri, rows, configuration=CDF)
            return
        write_deltalake(self.uri, rows, mode="overwrite",
                        predicate=f"window_start >= '{lo:%Y-%m-%dT%H:%M:%SZ}' AND window_start < '{hi:%Y-%m-%dT%H:%M:%SZ}'")

    def rewrite(self, rows: pa.Table) -> None:
        """Every file replaced by new ones (removes and adds, no change data: a flow's sink commit)."""
        write_deltalake(self.uri, rows, mode="overwrite")

    def table(self) -> DeltaTable:
        return DeltaTable(self.uri)

    def version(self) -> int:
        return self.table().version()

    def rows(self, version: int | None = None) -> list[tuple]:
        dt = DeltaTable(self.uri, version=version)
        return sorted(tuple(r.values()) for r in read_arrow(self.uri, dt).to_pylist())


def connection(pg_server, database: str, **kw) -> dict[str, Connection]:
    return {"pg": Connection("pg", pg_server.url(database, **kw))}


def exporter(root: str, pg_server, database: str, **kw) -> Exporter:
    return Exporter(root, connections=connection(pg_server, database), **kw)


def target_rows(pg_server, database: str, table: str = "m1", columns: str = "*") -> list[tuple]:
    with psycopg.connect(pg_server.url(database), autocommit=True) as conn:
        return sorted(conn.execute(f"SELECT {columns} FROM {table}").fetchall())


def delivered_version(pg_server, database: str, export: str = "m1_pg") -> int | None:
    with psycopg.connect(pg_server.url(database), autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('public.laminar_exports') IS NOT NULL").fetchone()[0]:
            return None
        row = conn.execute("SELECT delivered_version FROM laminar_exports WHERE export = %s", (export,)).fetchone()
        return row[0] if row else None


def execute(pg_server, database: str, *statements: str) -> None:
    with psycopg.connect(pg_server.url(database), autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def crash_at(step: str):
    """A delivery hook that crashes at `step` (one of `EXPORT_STEPS`), as a kill there would."""
    from laminar_assets.errors import InjectedCrash

    def hook(at: str) -> None:
        if at == step:
            raise InjectedCrash(f"injected crash at {step}")
    return hook


def change_history(sink: Sink) -> None:
    """Late rows, an update and a delete since the delivered version, in three commits."""
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 2.0), (0, 1, "b", 1, 1.0), (0, 2, "c", 1, 1.0)]))
    sink.table().update(updates={"total": "total + 1"}, predicate="sym = 'b'")
    sink.table().delete("sym = 'a'")
