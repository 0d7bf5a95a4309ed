"""What delivering a flow's table to Postgres and Redis costs after a small change, against re-copying it whole
(issue #61).

    python -m bench.export_cost [--rows 1000000] [--change 0.01] [--rounds 3] [--symbols 200] [--no-redis]

A per-minute VWAP sink (`window_start`, `window_end`, `symbol`, `notional`, `volume`, `trades`, `vwap`; hourly
partitions, one Parquet file per hour, change data feed on) is written and committed the way a flow's run
commits it (`write_uncommitted_rows` + `replace_ranges`: one Delta commit removes the touched hours' files and adds
new ones; no Spark), delivered once in full to a throwaway Postgres (pgserver, Unix socket) and a throwaway Redis
(Debian's redis-server on 127.0.0.1, nothing saved; both started here and stopped at the end, also on failure),
then changed `--rounds` times. Each round's change is `--change` of the
rows: half new minutes at the tip, 45% updates of existing keys (in the tip hour and three late hours) and 5%
deletes (windows that lost their trades), committed as one run replacing every touched hour's rows. Timed per
round, in this order:

* `incremental`: `Exporter.deliver` (the change feed since the delivered version, upserts and deletes);
* `full_resync`: `Exporter.deliver(full=True)` (FORCED_BY_USER: TRUNCATE, COPY the table in, in one
  transaction): the naive job done by Laminar's own path;
* `naive_copy`: a plain job that reads the whole Delta table with pyarrow and does TRUNCATE + COPY into a
  second table with the same primary key, in one transaction;
* `redis_incremental` and `redis_full_resync`: the same two deliveries of a `RedisExport` of the same table (one
  hash per symbol, holding its latest minute's row): the keys the change feed touched, their latest rows read
  from the sink at the pinned version, against every row of the table streamed to find each symbol's latest
  (and the keys under the prefix the resync did not write removed).

After every step the Postgres table is compared with the Delta table at the delivered version: the row count,
and every row in key order (Postgres `COPY (SELECT ... ORDER BY ...)` parsed back to Arrow, against the Delta
snapshot sorted the same way; floats exact); and Redis's keys with the latest row of each symbol of that
snapshot (every field parsed back, floats exact, no key more or less). A mismatch exits with status 1; speed
never does. Prints a table and writes `bench/results/export_cost.json` (`--out`), with the load average around
each timed step (the machine may be shared).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from deltalake import DeltaTable

from laminar_assets.engine import Agg, Connection, Exporter, FlowSpec, Interval, PostgresExport, RedisExport, Tumbling
from laminar_assets.engine.delta.arrow_reads import arrow_dataset, read_arrow
from laminar_assets.engine.output import replace_ranges
from laminar_assets.engine.output.uncommitted import write_uncommitted_rows

from .environment import code_fingerprint, machine

START = datetime(2024, 1, 2, tzinfo=UTC)
START_US = int(START.timestamp() * 1_000_000)
MINUTE_US = 60_000_000
FLOW = FlowSpec(name="vwap_1m", source="trades", event_time="event_time", window=Tumbling("1m"), keys=("symbol",),
                aggregates=(Agg.sum("notional", name="notional"), Agg.sum("quantity", name="volume"),
                            Agg.count(name="trades")),
                post={"vwap": "notional / volume"}, partitioning="hourly")
EXPORT = PostgresExport(name="vwap_1m_pg", source="vwap_1m", connection="analytics", table="vwap_1m")
REDIS_EXPORT = RedisExport(name="vwap_1m_cache", source="vwap_1m", connection="cache", key_prefix="vwap")
NAIVE_TABLE = "vwap_1m_naive"
COLUMNS = ["window_start", "window_end", "symbol", "notional", "volume", "trades", "vwap"]
LATE_HOURS = 3
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "export_cost.json")


# --- the sink -----------------------------------------------------------------------------------------------
class Sink:
    """The sink's rows as (slot, salt) pairs: slot i is minute i // symbols of symbol i % symbols; salt says
    which version of its values it holds. Every row's values follow from the pair, so the content is known
    without reading the table back."""

    def __init__(self, uri: str, symbols: int, rows: int) -> None:
        self.uri, self.symbols = uri, symbols
        self.per_hour = symbols * 60
        self.slots = np.arange(rows, dtype=np.int64)
        self.salts = np.zeros(rows, dtype=np.int64)
        self.names = np.array([f"S{i:04d}" for i in range(symbols)], dtype=object)

    def rows(self, slots: np.ndarray, salts: np.ndarray) -> pa.Table:
        """The sink rows of these slots (and `__part`, the hour's partition id, which is not written)."""
        minute = slots // self.symbols
        sym = slots % self.symbols
        h = (slots * 2654435761 + salts * 40503 + 12345) % (2 ** 32)
        volume = 1 + h % 5000
        price = 50.0 + (sym % 97) + (h % 1000) / 1000.0
        notional = volume * price
        start = START_US + minute * MINUTE_US
        hour = minute // 60
        return pa.table({
            "window_start": pa.array(start, pa.timestamp("us", "UTC")),
            "window_end": pa.array(start + MINUTE_US, pa.timestamp("us", "UTC")),
            "symbol": pa.array(self.names[sym], pa.string()),
            "notional": pa.array(notional, pa.float64()),
            "volume": pa.array(volume, pa.int64()),
            "trades": pa.array(1 + h % 40, pa.int64()),
            "vwap": pa.array(notional / volume, pa.float64()),
            "__part": pa.array(np.char.mod("h%06d", hour), pa.string()),
        })

    def hour_of(self, slots: np.ndarray) -> np.ndarray:
        return slots // self.per_hour

    def commit(self, run: str, hours: list[int]) -> float:
        """Replace the rows of `hours` (every hour when empty: the first write) with the current rows, the way a
        flow's run commits its sink: one Parquet file per hour written, one Delta commit. Returns seconds."""
        t0 = time.perf_counter()
        keep = np.isin(self.hour_of(self.slots), hours) if hours else np.ones(len(self.slots), bool)
        files = write_uncommitted_rows(self.rows(self.slots[keep], self.salts[keep]), [(self.uri, run, COLUMNS)],
                                       by="__part")[0]
        ranges = [Interval(START + timedelta(hours=int(h)), START + timedelta(hours=int(h) + 1)) for h in hours]
        replace_ranges(None, files, table_uri=self.uri, column="window_start", ranges=ranges, transactions=[],
                       metadata={}, run_id=run, append_only=not hours, owner=FLOW.name)
        return time.perf_counter() - t0

    def change(self, fraction: float, salt: int, rng: np.random.Generator) -> dict:
        """One run's change: new minutes at the tip, updates in the tip hour and three late hours, a few
        deletes in the late hours. Returns the counts and the hours touched (committed by `commit`)."""
        n = max(3, round(len(self.slots) * fraction))
        n_new, n_del = n // 2, max(1, n // 20)
        n_upd = n - n_new - n_del
        tip = int(self.slots.max()) + 1
        tip_hour = int(self.hour_of(np.array([tip - 1]))[0])
        complete = np.unique(self.hour_of(self.slots))
        late = rng.choice(complete[complete < tip_hour - 1], size=LATE_HOURS, replace=False)
        in_late = np.flatnonzero(np.isin(self.hour_of(self.slots), late))
        in_tip = np.flatnonzero(self.hour_of(self.slots) == tip_hour)
        deleted = rng.choice(in_late, size=n_del, replace=False)
        candidates = np.setdiff1d(np.concatenate([in_late, in_tip]), deleted)
        updated = rng.choice(candidates, size=n_upd, replace=False)
        self.salts[updated] = salt
        keep = np.ones(len(self.slots), bool)
        keep[deleted] = False
        new = np.arange(tip, tip + n_new, dtype=np.int64)
        self.slots = np.concatenate([self.slots[keep], new])
        self.salts = np.concatenate([self.salts[keep], np.full(n_new, salt, np.int64)])
        hours = sorted({*map(int, late), tip_hour, *map(int, np.unique(self.hour_of(new)))})
        return {"new": n_new, "updated": n_upd, "deleted": n_del, "hours_touched": len(hours), "hours": hours}


# --- Postgres -----------------------------------------------------------------------------------------------
def start_postgres():
    """The tests' throwaway server (pgserver, Unix socket only): `tests/postgres.py`."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.postgres import start_postgres as start

    return start()


def start_redis():
    """The tests' throwaway Redis (redis-server on 127.0.0.1, a free port, nothing saved): `tests/redis_server.py`."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.redis_server import start_redis as start

    return start()


def pg_rows(conn: psycopg.Connection, table: str) -> pa.Table:
    """Every row of `table` in key order, as Arrow (timestamps as UTC microseconds)."""
    buffer = io.BytesIO()
    query = (f"COPY (SELECT (extract(epoch FROM window_start) * 1000000)::bigint, "
             f"(extract(epoch FROM window_end) * 1000000)::bigint, symbol, notional, volume, trades, vwap FROM {table} "
             f"ORDER BY window_start, symbol COLLATE \"C\") TO STDOUT (FORMAT csv)")
    with conn.cursor() as cur, cur.copy(query) as copy:
        for chunk in copy:
            buffer.write(chunk)
    types = {"window_start": pa.int64(), "window_end": pa.int64(), "symbol": pa.string(), "notional": pa.float64(),
             "volume": pa.int64(), "trades": pa.int64(), "vwap": pa.float64()}
    if buffer.tell() == 0:
        return pa.schema(types).empty_table()
    buffer.seek(0)
    return pcsv.read_csv(buffer, read_options=pcsv.ReadOptions(column_names=COLUMNS),
                         convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False))


def delta_rows(uri: str, version: int) -> pa.Table:
    t = read_arrow(uri, DeltaTable(uri, version=version), columns=COLUMNS)
    t = t.set_column(0, "window_start", pc.cast(pc.cast(t.column("window_start"), pa.timestamp("us", "UTC")), pa.int64()))
    t = t.set_column(1, "window_end", pc.cast(pc.cast(t.column("window_end"), pa.timestamp("us", "UTC")), pa.int64()))
    t = t.set_column(2, "symbol", pc.cast(t.column("symbol"), pa.string()))
    return t.sort_by([("window_start", "ascending"), ("symbol", "ascending")]).combine_chunks()


def compare(conn: psycopg.Connection, table: str, uri: str, version: int) -> dict:
    """The Postgres table against the Delta table at `version`: counts, sums, and every row in key order."""
    want, got = delta_rows(uri, version), pg_rows(conn, table)
    first_diff = None
    if want.num_rows == got.num_rows:
        for name in COLUMNS:
            ne = pc.not_equal(want.column(name), got.column(name).cast(want.column(name).type))
            if pc.any(ne).as_py():
                first_diff = {"column": name, "row": int(pc.index(ne, True).as_py())}
                break
    sums = conn.execute(f"SELECT count(*), coalesce(sum(volume), 0), coalesce(sum(trades), 0) FROM {table}").fetchone()
    delta_sums = (want.num_rows, pc.sum(want.column("volume")).as_py() or 0, pc.sum(want.column("trades")).as_py() or 0)
    equal = want.num_rows == got.num_rows and first_diff is None and tuple(map(int, sums)) == delta_sums
    return {"equal": equal, "delta_version": version, "rows_delta": want.num_rows, "rows_postgres": got.num_rows,
            "sum_volume_delta": delta_sums[1], "sum_volume_postgres": int(sums[1]), "first_difference": first_diff}


def compare_redis(client, uri: str, version: int) -> dict:
    """Redis's keys under the export's prefix against the Delta table at `version`: one key per symbol, holding
    the row of its latest minute (every field read back to its type, floats exact), no other key."""
    t = delta_rows(uri, version)
    latest = t.group_by("symbol").aggregate([("window_start", "max")])
    want = t.join(latest.rename_columns(["symbol", "window_start"]), ["symbol", "window_start"], join_type="inner")
    expected = {f"{REDIS_EXPORT.key_prefix}:{r['symbol']}": r for r in want.to_pylist()}
    keys = sorted(client.scan_iter(match=f"{REDIS_EXPORT.key_prefix}:*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    got, versions = {}, []
    for key, fields in zip(keys, pipe.execute()):
        versions.append(int(fields.pop("_laminar_version")))
        got[key] = {"window_start": _us(fields["window_start"]), "window_end": _us(fields["window_end"]),
                    "symbol": fields["symbol"], "notional": float(fields["notional"]), "volume": int(fields["volume"]),
                    "trades": int(fields["trades"]), "vwap": float(fields["vwap"])}
    state = client.hgetall(f"laminar:exports:{REDIS_EXPORT.name}")
    wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    equal = not wrong and int(state.get("version", -1)) == version and max(versions, default=0) <= version
    return {"equal": equal, "delta_version": version, "keys_expected": len(expected), "keys_redis": len(got),
            "state_version": int(state.get("version", -1)), "first_difference": wrong[0] if wrong else None}


def _us(text: str) -> int:
    """Redis's ISO 8601 text of a UTC timestamp as microseconds since the epoch."""
    at = datetime.fromisoformat(text)
    return int((at - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


def written_by_last_delivery(conn: psycopg.Connection) -> int:
    """Row versions the last delivery wrote into the target (inserted or updated): rows whose xmin is the
    transaction that wrote the export's row in `laminar_exports`, as Postgres counts them."""
    return conn.execute(f"SELECT count(*) FROM {EXPORT.table} t WHERE t.xmin = "
                        "(SELECT xmin FROM laminar_exports WHERE export = %s)", (EXPORT.name,)).fetchone()[0]


def naive_copy(url: str, uri: str, version: int, batch_rows: int) -> dict:
    """The job an export replaces: read every row of the Delta table, TRUNCATE the Postgres copy, COPY it all."""
    t0 = time.perf_counter()
    dataset = arrow_dataset(uri, DeltaTable(uri, version=version))
    rows = 0
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(f"TRUNCATE {NAIVE_TABLE}")
        with conn.cursor() as cur, cur.copy(f"COPY {NAIVE_TABLE} ({', '.join(COLUMNS)}) FROM STDIN (FORMAT csv)") as cp:
            for batch in dataset.to_batches(columns=COLUMNS, batch_size=batch_rows):
                buffer = io.BytesIO()
                pcsv.write_csv(batch, buffer, pcsv.WriteOptions(include_header=False))
                cp.write(buffer.getbuffer())
                rows += batch.num_rows
    return {"seconds": round(time.perf_counter() - t0, 3), "rows_sent": rows}


# --- the run ------------------------------------------------------------------------------------------------
def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def delivery(exporter: Exporter, conn: psycopg.Connection, *, full: bool = False) -> dict:
    before = load()
    t0 = time.perf_counter()
    r = exporter.deliver(EXPORT, FLOW, full=full)
    wall = time.perf_counter() - t0
    return {"seconds": round(wall, 3), "mode": r.mode.value, "reason": r.reason.value, "version": r.delivered_version,
            "change_rows_read": r.change_rows, "rows_upserted": r.rows_upserted, "rows_deleted": r.rows_deleted,
            "postgres_rows_written": written_by_last_delivery(conn), "phases_s": r.seconds, "load_before": before}


def redis_delivery(exporter: Exporter, *, full: bool = False) -> dict:
    before = load()
    t0 = time.perf_counter()
    r = exporter.deliver(REDIS_EXPORT, FLOW, full=full)
    wall = time.perf_counter() - t0
    return {"seconds": round(wall, 3), "mode": r.mode.value, "reason": r.reason.value, "version": r.delivered_version,
            "change_rows_read": r.change_rows, "keys_written": r.rows_upserted, "keys_deleted": r.rows_deleted,
            "phases_s": r.seconds, "load_before": before}


def run(a: argparse.Namespace, pg, work: str, cache=None) -> dict:
    url = pg.url()
    connections = {"analytics": Connection("analytics", url)}
    if cache is not None:
        connections["cache"] = Connection("cache", cache.url())
    exporter = Exporter(work, connections=connections)
    sink = Sink(exporter.layout.sink_uri(FLOW), a.symbols, a.rows)
    rng = np.random.default_rng(61)
    out: dict = {"rows": a.rows, "change": a.change, "symbols": a.symbols, "rounds_asked": a.rounds,
                 "hours": int(sink.hour_of(sink.slots).max()) + 1, "batch_rows": EXPORT.batch_rows,
                 "machine": machine(), "code": code_fingerprint(), "load_start": load(),
                 "naive": "full_resync: Exporter.deliver(full=True), TRUNCATE + COPY in one transaction; naive_copy: "
                          "pyarrow read of the whole Delta table, TRUNCATE + COPY into a second table (same primary "
                          "key), one transaction",
                 "rounds": []}
    out["base_commit_s"] = round(sink.commit("base", []), 3)
    ok = True
    with psycopg.connect(url, autocommit=True) as conn:
        first = delivery(exporter, conn)
        first["check"] = compare(conn, EXPORT.table, sink.uri, first["version"])
        ok &= first["check"]["equal"]
        out["first_delivery"] = first
        redis_client = cache.client() if cache is not None else None
        if redis_client is not None:
            first = redis_delivery(exporter)
            first["check"] = compare_redis(redis_client, sink.uri, first["version"])
            ok &= first["check"]["equal"]
            out["redis_first_delivery"] = first
        conn.execute(f"CREATE TABLE {NAIVE_TABLE} (LIKE {EXPORT.table} INCLUDING ALL)")
        for i in range(1, a.rounds + 1):
            change = sink.change(a.change, salt=i, rng=rng)
            change["commit_s"] = round(sink.commit(f"round{i}", change.pop("hours")), 3)
            inc = delivery(exporter, conn)
            inc["check"] = compare(conn, EXPORT.table, sink.uri, inc["version"])
            full = delivery(exporter, conn, full=True)
            full["check"] = compare(conn, EXPORT.table, sink.uri, full["version"])
            before = load()
            naive = {**naive_copy(url, sink.uri, full["version"], EXPORT.batch_rows), "load_before": before}
            naive["check"] = compare(conn, NAIVE_TABLE, sink.uri, full["version"])
            ok &= inc["check"]["equal"] and full["check"]["equal"] and naive["check"]["equal"]
            entry = {"round": i, "change": change, "incremental": inc, "full_resync": full, "naive_copy": naive,
                     "ratio_vs_full_resync": round(inc["seconds"] / full["seconds"], 4),
                     "ratio_vs_naive_copy": round(inc["seconds"] / naive["seconds"], 4)}
            print(f"round {i}: incremental {inc['seconds']:.2f} s ({inc['rows_upserted']} upserted, "
                  f"{inc['rows_deleted']} deleted), full resync {full['seconds']:.2f} s, naive copy "
                  f"{naive['seconds']:.2f} s, equal {inc['check']['equal'] and full['check']['equal']}", flush=True)
            if redis_client is not None:
                r_inc = redis_delivery(exporter)
                r_inc["check"] = compare_redis(redis_client, sink.uri, r_inc["version"])
                r_full = redis_delivery(exporter, full=True)
                r_full["check"] = compare_redis(redis_client, sink.uri, r_full["version"])
                ok &= r_inc["check"]["equal"] and r_full["check"]["equal"]
                entry.update(redis_incremental=r_inc, redis_full_resync=r_full,
                             redis_ratio_vs_full_resync=round(r_inc["seconds"] / r_full["seconds"], 4))
                print(f"round {i}: redis incremental {r_inc['seconds']:.2f} s ({r_inc['keys_written']} keys written, "
                      f"{r_inc['change_rows_read']} change rows read), full resync {r_full['seconds']:.2f} s, equal "
                      f"{r_inc['check']['equal'] and r_full['check']['equal']}", flush=True)
            out["rounds"].append(entry)
        out["table_bytes"] = conn.execute("SELECT pg_total_relation_size(%s)", (EXPORT.table,)).fetchone()[0]
        if redis_client is not None:
            redis_client.close()
    rounds = out["rounds"]

    def med(path):
        values = [r for r in rounds if path[0] in r]
        for p in path:
            values = [v[p] for v in values]
        return round(statistics.median(values), 4) if values else None

    out["summary"] = {"incremental_s": med(["incremental", "seconds"]), "full_resync_s": med(["full_resync", "seconds"]),
                      "naive_copy_s": med(["naive_copy", "seconds"]),
                      "ratio_vs_full_resync": med(["ratio_vs_full_resync"]),
                      "ratio_vs_naive_copy": med(["ratio_vs_naive_copy"]),
                      "redis_incremental_s": med(["redis_incremental", "seconds"]),
                      "redis_full_resync_s": med(["redis_full_resync", "seconds"]),
                      "redis_ratio_vs_full_resync": med(["redis_ratio_vs_full_resync"]),
                      "target": "incremental <= 0.05x the full copy", "results_equal": bool(ok)}
    out["load_end"] = load()
    return out


def report(out: dict) -> str:
    lines = [f"export cost: {out['rows']:,} rows, {out['change']:.1%} change per round, {len(out['rounds'])} rounds, "
             f"load at start {out['load_start']}",
             f"{'round':>5} {'rows read':>10} {'upserted':>9} {'deleted':>8} {'pg written':>10} {'incr s':>7} "
             f"{'resync s':>8} {'naive s':>8} {'ratio':>6} {'equal':>5}"]
    for r in out["rounds"]:
        inc = r["incremental"]
        equal = all(r[k]["check"]["equal"] for k in ("incremental", "full_resync", "naive_copy"))
        lines.append(f"{r['round']:>5} {inc['change_rows_read']:>10,} {inc['rows_upserted']:>9,} {inc['rows_deleted']:>8,} "
                     f"{inc['postgres_rows_written']:>10,} {inc['seconds']:>7.2f} {r['full_resync']['seconds']:>8.2f} "
                     f"{r['naive_copy']['seconds']:>8.2f} {r['ratio_vs_full_resync']:>6.3f} {str(equal):>5}")
    if any("redis_incremental" in r for r in out["rounds"]):
        lines.append(f"{'redis':>5} {'rows read':>10} {'written':>9} {'deleted':>8} {'':>10} {'incr s':>7} {'resync s':>8} "
                     f"{'':>8} {'ratio':>6} {'equal':>5}")
        for r in out["rounds"]:
            inc, full = r["redis_incremental"], r["redis_full_resync"]
            equal = inc["check"]["equal"] and full["check"]["equal"]
            lines.append(f"{r['round']:>5} {inc['change_rows_read']:>10,} {inc['keys_written']:>9,} "
                         f"{inc['keys_deleted']:>8,} {'':>10} {inc['seconds']:>7.2f} {full['seconds']:>8.2f} {'':>8} "
                         f"{r['redis_ratio_vs_full_resync']:>6.3f} {str(equal):>5}")
    s = out["summary"]
    lines.append(f"median: incremental {s['incremental_s']} s, full resync {s['full_resync_s']} s, naive copy "
                 f"{s['naive_copy_s']} s; ratio {s['ratio_vs_full_resync']} (resync), {s['ratio_vs_naive_copy']} (naive); "
                 f"target <= 0.05; results equal: {s['results_equal']}")
    if s["redis_incremental_s"] is not None:
        lines.append(f"median redis: incremental {s['redis_incremental_s']} s, full resync {s['redis_full_resync_s']} s; "
                     f"ratio {s['redis_ratio_vs_full_resync']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--change", type=float, default=0.01, help="share of the rows changed per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--symbols", type=int, default=200, help="symbols per minute (rows per hour: 60x this)")
    ap.add_argument("--no-redis", action="store_true", help="Postgres only (no redis-server needed)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if a.rows < a.symbols * 60 * (LATE_HOURS + 3):
        ap.error(f"--rows must be at least {a.symbols * 60 * (LATE_HOURS + 3)} ({LATE_HOURS + 3} hours of "
                 f"{a.symbols} symbols) so a change has late hours to touch")
    pg = start_postgres()
    cache = None
    try:
        cache = None if a.no_redis else start_redis()
        with tempfile.TemporaryDirectory(prefix="laminar-export-cost-") as work:
            out = run(a, pg, work, cache)
    finally:
        try:
            if cache is not None:
                cache.stop()
        finally:
            pg.stop()
    print(report(out))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1, default=str)
        fh.write("\n")
    print(f"wrote {a.out}")
    return 0 if out["summary"]["results_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
