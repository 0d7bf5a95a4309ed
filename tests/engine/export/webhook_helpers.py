"""A keyless stage's Delta table (like the demo's `large_trades`) written as Laminar writes it (change data on),
and the webhook export of it with short timeouts and backoffs, for the webhook tests. No Spark."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Connection, Exporter, StageSpec, WebhookExport
from laminar_assets.engine.delta.arrow_reads import read_arrow
from laminar_assets.engine.export.dead_letters import table_uri as dead_letters_uri

STAGE = StageSpec(name="large_trades", source="trades", event_time="ts")
TOKEN = "tok-3f9a1c77e2"
# quick to give up, so that every test runs in a second or two: 10 ms backoffs, 3 attempts; a 5 s timeout (an
# answer late on a loaded machine would be sent again, and the tests count requests); `hook(timeout_seconds=0.3)`
# where a test waits for the timeout
HOOK = WebhookExport(name="large_trades_hook", source="large_trades", connection="alerts", timeout_seconds=5.0,
                     backoff_seconds=0.01, max_backoff_seconds=0.05, max_attempts=3, max_rows_per_second=None)
DAY = datetime(2024, 1, 2, tzinfo=UTC)
CDF = {"delta.enableChangeDataFeed": "true"}


def hook(**options) -> WebhookExport:
    return replace(HOOK, **options)


def trades(*rows: tuple[int, str, float]) -> pa.Table:
    """(minute of the day, symbol, price) -> rows of the stage's table."""
    return pa.table({"ts": pa.array([DAY + timedelta(minutes=m) for m, _, _ in rows], pa.timestamp("us", "UTC")),
                     "sym": pa.array([s for _, s, _ in rows], pa.string()),
                     "px": pa.array([p for _, _, p in rows], pa.float64())})


class Trades:
    """The stage's Delta table under a lake root."""

    def __init__(self, root: str) -> None:
        self.uri = f"{root}/large_trades"

    def append(self, *rows: tuple[int, str, float]) -> None:
        if DeltaTable.is_deltatable(self.uri):
            write_deltalake(self.uri, trades(*rows), mode="append")
        else:
            write_deltalake(self.uri, trades(*rows), configuration=CDF)

    def table(self) -> DeltaTable:
        return DeltaTable(self.uri)

    def version(self) -> int:
        return self.table().version()

    def rows(self) -> list[dict]:
        return read_arrow(self.uri, self.table()).to_pylist()


def exporter(root: str, url: str, **kw) -> Exporter:
    return Exporter(root, connections={"alerts": Connection("alerts", url, {"token": TOKEN})}, **kw)


def dead_letters(root: str, export: str = HOOK.name) -> list[dict]:
    uri = dead_letters_uri(root, export)
    return read_arrow(uri, DeltaTable(uri)).to_pylist() if DeltaTable.is_deltatable(uri) else []


def row_of(event: dict) -> tuple:
    """(minute, sym, px) of an event's row."""
    row = event["row"]
    return (int((datetime.fromisoformat(row["ts"]) - DAY).total_seconds() // 60), row["sym"], row["px"])
