"""Delta-version sensors against real commits: the exact run requests, idempotent run keys,
range runs for large dirty sets, graph order through a stage's own output sensor."""

from __future__ import annotations

import dagster as dg

from laminar_assets.flows import load_specs
from laminar_assets.schedules import build_schedule
from laminar_assets.sensors import RANGE_END, RANGE_START, build_version_sensor, consumers_by_table
from laminar_assets.settings import LaminarSettings
from tests.dagster.pipeline import BASE, create_sources, trades

SPECS = load_specs()
SETTINGS = LaminarSettings(backfill_threshold=24)
CONSUMERS = consumers_by_table(SPECS)


def evaluate(table, laminar, instance, cursor):
    sensor = build_version_sensor(table, CONSUMERS[table], SETTINGS)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"laminar": laminar}) as ctx:
        return sensor(ctx)


def requested(result):
    return sorted((r.asset_selection[0].to_user_string(), r.partition_key) for r in result.run_requests)


def test_raw_trades_sensor_requests_exact_partitions(lake, laminar, instance):
    create_sources(lake, BASE)
    first = evaluate("raw_trades", laminar, instance, None)
    assert requested(first) == [("normalized_trades", "2024-01-02-09:00"), ("normalized_trades", "2024-01-02-10:00")]
    assert first.cursor == "0"
    assert isinstance(evaluate("raw_trades", laminar, instance, "0"), dg.SkipReason)

    # append into the current window
    lake.append("raw_trades", frame=trades([(10, "2024-01-02 10:06:00", "MSFT", "ACC-3", "BUY", 411.0, 100)]))
    r = evaluate("raw_trades", laminar, instance, "0")
    assert requested(r) == [("normalized_trades", "2024-01-02-10:00")] and r.cursor == "1"
    # evaluated twice: the same run keys, so Dagster launches once
    again = evaluate("raw_trades", laminar, instance, "0")
    assert [q.run_key for q in again.run_requests] == [q.run_key for q in r.run_requests]
    assert r.run_requests[0].tags["laminar/partition"] == "normalized_trades/2024-01-02-10:00"

    # late rows into an old partition
    lake.append("raw_trades", frame=trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)]))
    assert requested(evaluate("raw_trades", laminar, instance, "1")) == [("normalized_trades", "2024-01-02-07:00")]

    # a delete: the change data file's statistics locate it
    lake.delete("raw_trades", "trade_id = 3")
    assert requested(evaluate("raw_trades", laminar, instance, "2")) == [("normalized_trades", "2024-01-02-09:00")]


def test_stage_output_sensor_fans_out_in_graph_order(lake, laminar, instance):
    create_sources(lake, BASE)
    lake.create("normalized_trades", frame=trades([(1, "2024-01-02 09:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100)])
                .assign(notional=19000.0, signed_quantity=100, sector="tech", currency="USD"))
    r = evaluate("normalized_trades", laminar, instance, None)
    got = requested(r)
    flows = {"vwap_1m", "ohlc_5m", "positions_1h", "large_trades"}
    assert {(f, "2024-01-02-09:00") for f in flows} <= set(got)
    # the hopping 1 h / 15 min window also reaches back into the previous hour's windows
    assert ("sector_stats_1h", "2024-01-02-08:00") in got and ("sector_stats_1h", "2024-01-02-09:00") in got
    assert not any(name == "normalized_trades" for name, _ in got)


def test_many_dirty_partitions_become_one_range_run(lake, laminar, instance):
    create_sources(lake, BASE)
    spread = [(100 + h, f"2024-01-{3 + h // 24:02d} {h % 24:02d}:10:00", "AAPL", "ACC-1", "BUY", 190.0, 100)
              for h in range(40)]
    lake.append("raw_trades", frame=trades(spread))
    r = evaluate("raw_trades", laminar, instance, "0")
    [request] = r.run_requests
    assert request.partition_key is None
    assert request.tags[RANGE_START] == "2024-01-03-00:00" and request.tags[RANGE_END] == "2024-01-04-15:00"
    assert request.tags["laminar/dirty_partitions"] == "40"


def test_dimension_sensor_refills_materialized_stage_partitions(lake, laminar, instance):
    create_sources(lake, BASE)
    from laminar_assets.checkpoints import CheckpointStore, Watermark

    CheckpointStore(lake.root).save(Watermark("normalized_trades", "2024-01-02-09:00", "x", {"raw_trades": 0}, 1))
    assert evaluate("symbols", laminar, instance, None).cursor == "0"
    lake.append("symbols", frame=lake.read("symbols").head(1))
    r = evaluate("symbols", laminar, instance, "0")
    assert requested(r) == [("normalized_trades", "2024-01-02-09:00")]


def test_schedule_requests_the_current_partition():
    spec = {s.name: s for s in SPECS}["vwap_1m"]
    _job, schedule = build_schedule(spec, "*/15 * * * *", SETTINGS)
    from datetime import datetime, timezone

    ctx = dg.build_schedule_context(scheduled_execution_time=datetime(2024, 1, 2, 10, 45, tzinfo=timezone.utc))
    request = schedule(ctx)
    assert request.partition_key == "2024-01-02-10:00"


def test_partitions_reading_a_failed_blocking_check_are_held_until_it_passes(lake, laminar, instance):
    from laminar_assets.sensors import parse_cursor

    stage = next(s for s in SPECS if s.name == "normalized_trades")
    sensor = build_version_sensor("normalized_trades", CONSUMERS["normalized_trades"], SETTINGS, stage)

    def tick(cursor):
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"laminar": laminar}) as ctx:
            return sensor(ctx)

    from laminar_assets.assets import partitions_def

    pdef = partitions_def(stage, SETTINGS)

    def report(passed):  # a real run of a `contract` check on the stage's 09:00 partition
        @dg.asset(name="normalized_trades", partitions_def=pdef)
        def _stage():
            return None

        @dg.asset_check(asset=_stage, name="contract", partitions_def=pdef)
        def _contract():
            return dg.AssetCheckResult(passed=passed)

        dg.materialize([_stage, _contract], partition_key="2024-01-02-09:00", instance=instance,
                       raise_on_error=False)

    create_sources(lake, BASE)
    lake.create("normalized_trades", frame=trades([(1, "2024-01-02 09:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100),
                                                   (2, "2024-01-02 10:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100)])
                .assign(notional=19000.0, signed_quantity=100, sector="tech", currency="USD"))
    report(False)
    held = tick(None)
    assert {k for _, k in requested(held)} == {"2024-01-02-10:00"}  # 09:00 reads the failed partition
    version, parked = parse_cursor(held.cursor)
    assert version == 0 and parked["vwap_1m"] == ["2024-01-02-09:00"]
    # hopping 1 h windows starting at 08:xx read 09:xx rows too
    assert parked["sector_stats_1h"] == ["2024-01-02-08:00", "2024-01-02-09:00"]
    assert isinstance(tick(held.cursor), dg.SkipReason) or not tick(held.cursor).run_requests
    report(True)
    released = tick(held.cursor)
    assert {k for _, k in requested(released)} == {"2024-01-02-08:00", "2024-01-02-09:00"}
    assert released.cursor == "0"


def test_range_runs_never_span_a_partition_left_out():
    from laminar_assets.sensors import partition_requests

    stage = next(s for s in SPECS if s.name == "normalized_trades")
    keys = [f"2024-01-03-{h:02d}:00" for h in range(24) if h not in (14, 15)] + \
        [f"2024-01-04-{h:02d}:00" for h in range(6)]
    requests = partition_requests(stage, keys, SETTINGS, run_key_prefix="t")
    assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in requests] == [
        ("2024-01-03-00:00", "2024-01-03-13:00"), ("2024-01-03-16:00", "2024-01-04-05:00")]


def test_new_commits_stops_at_the_version_the_tick_read(lake):
    from laminar_assets.engine.inspect import new_commits

    create_sources(lake, BASE)
    lake.append("raw_trades", frame=trades([(10, "2024-01-02 10:06:00", "MSFT", "ACC-3", "BUY", 411.0, 100)]))
    assert new_commits(lake.root, "raw_trades", "event_time", 0, upto=0) is None  # landed after the tick began
    assert new_commits(lake.root, "raw_trades", "event_time", 0).to_version == 1
