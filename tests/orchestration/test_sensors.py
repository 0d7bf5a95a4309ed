"""The pipeline sensor against real commits: one run request per tick for the whole connected part,
the exact partitions, idempotent run keys, graph order inside the run, held partitions, and no
re-runs from a sensor without a cursor on a lake that is up to date."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import dagster as dg
from deltalake import DeltaTable

from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.definitions import specs_with_contracts
from laminar_assets.flows import load_specs
from laminar_assets.orchestration import sensors
from laminar_assets.orchestration.assets import partitions_def
from laminar_assets.orchestration.internals.run_processes import RunProcess
from laminar_assets.orchestration.schedules import build_schedule
from laminar_assets.orchestration.sensors import RANGE_END, RANGE_START, build_pipeline_sensor, parse_cursor, range_requests
from laminar_assets.pipeline.graph import components, graph_order
from laminar_assets.pipeline.settings import LaminarSettings
from tests.orchestration.pipeline import BASE, create_sources, trades

SPECS, _ = specs_with_contracts(load_specs())
BY_NAME = {s.name: s for s in SPECS}
SETTINGS = LaminarSettings(sensor_watch_seconds=0)  # each tick answers at once; the watch has tests of its own
[PART] = components(SPECS)
FLOWS = {"vwap_1m", "ohlc_5m", "positions_1h", "large_trades", "sector_stats_1h", "symbol_activity_15m",
         "sector_median_1h"}


def tick(laminar, instance, cursor, blocking=frozenset(), settings=SETTINGS):
    sensor = build_pipeline_sensor(PART, settings, blocking=set(blocking), contracts={"normalized_trades"})
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"laminar": laminar}) as ctx:
        return sensor(ctx)


def watching_tick(laminar, instance, cursor, *, meanwhile):
    """A tick as the daemon runs it (watching up to 20 s), while another thread does `meanwhile` 0.3 s into it."""
    other = threading.Thread(target=lambda: (time.sleep(0.3), meanwhile()))
    other.start()
    try:
        return tick(laminar, instance, cursor, settings=LaminarSettings(sensor_watch_seconds=20))
    finally:
        other.join()


def span(request):
    if request.partition_key:
        return request.partition_key, request.partition_key
    return request.tags[RANGE_START], request.tags[RANGE_END]


def test_components_and_graph_order():
    assert PART.name == "raw_trades" and PART.external == ("raw_trades", "symbols")
    assert PART.specs[0].name == "normalized_trades" and {s.name for s in PART.specs[1:]} == FLOWS
    assert graph_order(list(reversed(SPECS)))[0].name == "normalized_trades"


def test_one_run_for_the_stage_and_every_flow_it_feeds(lake, laminar, instance):
    create_sources(lake, BASE)
    first = tick(laminar, instance, None)
    [request] = first.run_requests
    assert set(request.asset_selection) == {dg.AssetKey(s.name) for s in SPECS}
    # stage 09:00-10:00; sector_stats_1h's hopping windows reach back to 08:00
    assert span(request) == ("2024-01-02-08:00", "2024-01-02-10:00")
    assert request.tags["laminar/component"] == "raw_trades"
    assert {c.name for c in request.asset_check_keys} == {"contract", "equivalence"}
    assert parse_cursor(first.cursor).versions == {"raw_trades": 0, "symbols": 0}
    # evaluated twice on the same state: the same run key, so Dagster launches once
    assert tick(laminar, instance, None).run_requests[0].run_key == request.run_key


def test_a_late_row_requests_only_the_partitions_it_touches(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    lake.append("raw_trades", frame=trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)]))
    [request] = tick(laminar, instance, cursor).run_requests
    assert span(request) == ("2024-01-02-06:00", "2024-01-02-07:00")  # hopping flows reach back an hour
    assert json.loads(tick(laminar, instance, cursor).cursor)["versions"]["raw_trades"] == 1


def test_the_sensor_records_source_versions_as_observations(lake, laminar, instance):
    create_sources(lake, BASE)
    first = tick(laminar, instance, None)
    seen = {e.asset_key.to_user_string(): e for e in first.asset_events}
    assert set(seen) == {"raw_trades", "symbols"}  # the sources, not the stage the part produces
    assert seen["raw_trades"].metadata["delta_version"].value == 0
    assert seen["raw_trades"].tags["dagster/data_version"] == "0"
    lake.append("raw_trades", frame=trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)]))
    [moved] = tick(laminar, instance, first.cursor).asset_events  # only the table that moved
    assert (moved.asset_key.to_user_string(), moved.metadata["delta_version"].value) == ("raw_trades", 1)


def test_a_recreated_lake_at_the_versions_the_cursor_saw_is_not_skipped(lake, laminar, instance):
    """`make demo` run again deletes and rebuilds the lake while Dagster keeps the sensor's cursor: the
    new tables reach the old versions with other commits. Versions are compared within a table id."""
    import shutil

    create_sources(lake, BASE)
    lake.append("raw_trades", frame=trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)]))
    cursor = tick(laminar, instance, None).cursor
    assert parse_cursor(cursor).versions["raw_trades"] == 1
    lake.append("raw_trades", frame=trades([(14, "2024-01-02 14:10:00", "XOM", "ACC-1", "SELL", 108.0, 7)]))
    [old_run] = tick(laminar, instance, cursor).run_requests  # versions 1..2 of the old table
    before_second = old_run.run_key
    shutil.rmtree(lake.root)
    create_sources(lake, BASE)
    lake.append("raw_trades", frame=trades([(12, "2024-01-02 13:20:00", "MSFT", "ACC-2", "BUY", 411.0, 50)]))
    result = tick(laminar, instance, cursor)  # raw_trades at version 1 again, another table
    [request] = result.run_requests
    assert span(request) == ("2024-01-02-08:00", "2024-01-02-13:00")  # the new table's rows, all of them
    assert {e.asset_key.to_user_string() for e in result.asset_events} == {"raw_trades", "symbols"}
    # a later commit brings raw_trades to version 2 again: the run's key must differ from the old
    # tables' run over the same versions, or Dagster skips it as done
    lake.append("raw_trades", frame=trades([(13, "2024-01-02 14:20:00", "MSFT", "ACC-2", "BUY", 412.0, 5)]))
    [again] = tick(laminar, instance, result.cursor).run_requests
    assert again.run_key != before_second


def test_many_partitions_are_still_one_run(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    spread = [(100 + h, f"2024-01-{3 + h // 24:02d} {h % 24:02d}:10:00", "AAPL", "ACC-1", "BUY", 190.0, 100)
              for h in range(0, 40, 3)]
    lake.append("raw_trades", frame=trades(spread))
    [request] = tick(laminar, instance, cursor).run_requests
    assert span(request) == ("2024-01-02-23:00", "2024-01-04-15:00")


def test_a_sensor_without_cursor_skips_what_the_watermarks_already_cover(lake, laminar, instance):
    create_sources(lake, BASE)
    store = CheckpointStore(lake.root)
    for key in ("2024-01-02-09:00", "2024-01-02-10:00"):
        store.save(Watermark("normalized_trades", key, BY_NAME["normalized_trades"].spec_hash,
                             {"raw_trades": 0, "symbols": 0}, 1))
    result = tick(laminar, instance, None)
    assert isinstance(result, dg.SensorResult) and result.run_requests == []  # e.g. `dagster dev` after the demo
    # what the tick's line in the UI says, instead of Dagster's "Sensor function returned an empty result"
    assert result.skip_reason.skip_message == ("nothing to run for the new versions (raw_trades -..0, symbols -..0): "
                                               "every partition they touch is up to date")
    lake.append("raw_trades", frame=trades([(10, "2024-01-02 10:06:00", "MSFT", "ACC-3", "BUY", 411.0, 100)]))
    [request] = tick(laminar, instance, result.cursor).run_requests
    assert span(request) == ("2024-01-02-09:00", "2024-01-02-10:00")


def test_a_sensor_without_cursor_requests_a_partition_whose_rows_were_all_deleted_since_its_run(lake, laminar, instance):
    """The tables' snapshots hold no trace of a partition whose rows are gone, so a tick that has no cursor to read
    the commits since (a new Dagster instance on an existing lake) takes every materialized partition as a candidate.
    Found by the random stateful test's sensor (tests/engine/stateful_lake.py): the partition stayed stale."""
    create_sources(lake, BASE)
    store = CheckpointStore(lake.root)
    for key in ("2024-01-02-09:00", "2024-01-02-10:00"):
        store.save(Watermark("normalized_trades", key, BY_NAME["normalized_trades"].spec_hash,
                             {"raw_trades": 0, "symbols": 0}, 1))
    DeltaTable(f"{lake.root}/raw_trades").delete("trade_id = 4")  # 10:05, the 10:00 partition's only row
    [request] = tick(laminar, instance, None).run_requests  # none before: 09:00 is current, 10:00 not in the snapshot
    assert span(request) == ("2024-01-02-09:00", "2024-01-02-10:00")  # the flows reading 10:00 go with it
    assert int(request.tags["laminar/dirty_partitions"]) >= 1 and dg.AssetKey("normalized_trades") in request.asset_selection


def test_a_watermark_of_a_table_since_recreated_is_not_current(lake):
    """A tick without a cursor trusts watermarks at the tables' versions, but not across a recreation."""
    from laminar_assets.pipeline.tick import is_current, table_versions

    create_sources(lake, BASE)
    store = CheckpointStore(lake.root)
    stage, key = BY_NAME["normalized_trades"], "2024-01-02-09:00"
    versions, ids = table_versions(lake.root, ("raw_trades", "symbols"))
    store.save(Watermark(stage.name, key, stage.spec_hash, dict(versions), 1, source_ids=dict(ids)))
    assert is_current(store, stage, key, versions, lambda *_: None, ids)
    import shutil

    shutil.rmtree(lake.path("raw_trades"))
    lake.create("raw_trades", frame=trades([(12, "2024-01-02 09:20:00", "MSFT", "ACC-2", "BUY", 411.0, 50)]))
    versions, ids = table_versions(lake.root, ("raw_trades", "symbols"))
    assert versions["raw_trades"] == 0  # the same version as the watermark's, of another table
    assert not is_current(store, stage, key, versions, lambda *_: None, ids)


def test_a_watermark_behind_only_by_commits_elsewhere_is_current(lake, laminar, instance):
    """A run covers the partitions a commit touched; the others keep older watermarks and must not
    be requested again by a tick without cursor."""
    create_sources(lake, BASE)
    lake.append("raw_trades", frame=trades([(10, "2024-01-02 10:06:00", "MSFT", "ACC-3", "BUY", 411.0, 100)]))
    store = CheckpointStore(lake.root)
    stage = BY_NAME["normalized_trades"].spec_hash
    store.save(Watermark("normalized_trades", "2024-01-02-09:00", stage, {"raw_trades": 0, "symbols": 0}, 1))
    store.save(Watermark("normalized_trades", "2024-01-02-10:00", stage, {"raw_trades": 1, "symbols": 0}, 2))
    assert tick(laminar, instance, None).run_requests == []
    store.save(Watermark("normalized_trades", "2024-01-02-10:00", stage, {"raw_trades": 0, "symbols": 0}, 2))
    [request] = tick(laminar, instance, None).run_requests  # 10:00 now lags a commit that touched it
    assert span(request)[1] == "2024-01-02-10:00"


def test_the_sensor_waits_while_a_run_of_the_part_is_in_progress(lake, laminar, instance):
    create_sources(lake, BASE)
    run = instance.create_run_for_job(dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(
        assets=[dg.AssetSpec("x")]).resolve_asset_graph()), tags={"laminar/component": "raw_trades"},
        status=dg.DagsterRunStatus.STARTED)
    skipped = tick(laminar, instance, None)
    assert isinstance(skipped, dg.SkipReason) and run.run_id in skipped.skip_message
    instance.report_run_failed(run)
    assert isinstance(tick(laminar, instance, None), dg.SensorResult)


def test_a_commit_landing_while_a_tick_watches_is_requested_by_that_tick(lake, laminar, instance):
    """A tick that finds nothing new watches the sources for `sensor_watch_seconds` (as the daemon runs it): a commit
    then is requested at once, not by the next tick a second later."""
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    late = trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)])
    result = watching_tick(laminar, instance, cursor, meanwhile=lambda: lake.append("raw_trades", frame=late))
    assert isinstance(result, dg.SensorResult), result
    [request] = result.run_requests
    assert span(request) == ("2024-01-02-06:00", "2024-01-02-07:00")
    assert parse_cursor(result.cursor).versions["raw_trades"] == 1


def test_a_tick_that_finds_its_parts_run_in_progress_requests_what_landed_once_the_run_ends(lake, laminar, instance):
    """The run's end is watched too: a commit that landed during a run is requested by the tick watching it end,
    not by the next tick."""
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    lake.append("raw_trades", frame=trades([(11, "2024-01-02 07:15:00", "XOM", "ACC-1", "SELL", 109.0, 100)]))
    run = instance.create_run_for_job(dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(
        assets=[dg.AssetSpec("x")]).resolve_asset_graph()), tags={"laminar/component": "raw_trades"},
        status=dg.DagsterRunStatus.STARTED)
    result = watching_tick(laminar, instance, cursor, meanwhile=lambda: instance.report_run_failed(run))
    assert isinstance(result, dg.SensorResult), result
    assert [span(r) for r in result.run_requests] == [("2024-01-02-06:00", "2024-01-02-07:00")]


def test_a_tick_with_nothing_new_skips_after_its_watch_and_says_so(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    skipped = tick(laminar, instance, cursor, settings=LaminarSettings(sensor_watch_seconds=0.2))
    assert isinstance(skipped, dg.SkipReason)
    assert skipped.skip_message == "no new versions of raw_trades, symbols, normalized_trades (watched for 0.2 s)"


def test_a_tick_run_in_this_process_by_a_caller_that_ticks_again_itself_never_watches(lake, laminar, instance,
                                                                                     monkeypatch):
    def watch(*_, **__):
        raise AssertionError("watched")

    monkeypatch.setattr(sensors, "watch_for_commits", watch)
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    token = sensors.WATCHING.set(False)
    try:
        skipped = tick(laminar, instance, cursor, settings=LaminarSettings(sensor_watch_seconds=20))
    finally:
        sensors.WATCHING.reset(token)
    assert isinstance(skipped, dg.SkipReason) and "watched" not in skipped.skip_message


def test_a_skip_after_a_failed_run_says_when_its_partitions_run_again(lake, laminar, instance):
    """A run failed outside its steps (its process found dead) runs again after a pause (test_resume.py); a skip that
    said only "no new versions" hid that partitions were behind."""
    create_sources(lake, BASE)
    result = tick(laminar, instance, None)
    cursor = result.cursor
    assert isinstance(tick(laminar, instance, cursor), dg.SkipReason)
    assert "last run" not in tick(laminar, instance, cursor).skip_message
    run = instance.create_run_for_job(dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(
        assets=[dg.AssetSpec("x")]).resolve_asset_graph()), tags={"laminar/component": "raw_trades"},
        status=dg.DagsterRunStatus.STARTED)
    instance.report_run_failed(run)
    skipped = tick(laminar, instance, cursor)
    assert isinstance(skipped, dg.SkipReason)
    assert skipped.skip_message.startswith("no new versions of raw_trades")
    assert f"failed runs of raw_trades whose partitions run again (the pause doubles): {run.run_id} (" \
        in skipped.skip_message
    assert re.search(r"\) in (29|30) s, attempt 1$", skipped.skip_message), skipped.skip_message


def test_a_run_of_the_part_whose_process_is_gone_is_failed_and_holds_the_sensor_no_longer(lake, laminar, instance):
    """A `laminar demo` (or a run worker) killed mid-run leaves its run STARTED: the sensor would skip
    forever. A real process stands for the run's: while it lives the sensor waits; once it is killed
    the sensor fails the run and requests again."""
    create_sources(lake, BASE)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        run = instance.create_run_for_job(dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(
            assets=[dg.AssetSpec("x")]).resolve_asset_graph()), status=dg.DagsterRunStatus.STARTED,
            tags={"laminar/component": "raw_trades", **RunProcess.of(child.pid).tag()})
        assert isinstance(tick(laminar, instance, None), dg.SkipReason)
    finally:
        child.kill()
        child.wait()
    assert isinstance(tick(laminar, instance, None), dg.SensorResult)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


def test_dimension_change_refills_materialized_stage_partitions(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    CheckpointStore(lake.root).save(Watermark("normalized_trades", "2024-01-02-09:00",
                                              BY_NAME["normalized_trades"].spec_hash, {"raw_trades": 0}, 1))
    lake.append("symbols", frame=lake.read("symbols").head(1))
    [request] = tick(laminar, instance, cursor).run_requests
    assert span(request) == ("2024-01-02-08:00", "2024-01-02-09:00")


def test_flow_partitions_reading_a_failed_blocking_check_are_held_until_it_passes(lake, laminar, instance):

    pdef = partitions_def(BY_NAME["normalized_trades"], SETTINGS)

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
    cursor = json.dumps({"versions": {"raw_trades": 0, "symbols": 0}})
    store = CheckpointStore(lake.root)
    for key in ("2024-01-02-09:00", "2024-01-02-10:00"):  # the stage is up to date; its output changes
        store.save(Watermark("normalized_trades", key, BY_NAME["normalized_trades"].spec_hash,
                             {"raw_trades": 0, "symbols": 0}, 1))
    lake.create("normalized_trades", frame=trades([(1, "2024-01-02 09:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100),
                                                   (2, "2024-01-02 10:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100)])
                .assign(notional=19000.0, signed_quantity=100, sector="tech", currency="USD"))
    report(False)
    held = tick(laminar, instance, cursor, blocking={"normalized_trades"})
    [request] = held.run_requests
    assert span(request) == ("2024-01-02-10:00", "2024-01-02-10:00")  # 09:00 reads the failed partition
    parked = parse_cursor(held.cursor).held
    assert parked["vwap_1m"] == ("2024-01-02-09:00",)
    assert parked["sector_stats_1h"] == ("2024-01-02-08:00", "2024-01-02-09:00")  # hopping windows read 09:xx
    report(True)
    released = tick(laminar, instance, held.cursor, blocking={"normalized_trades"})
    [request] = released.run_requests
    assert span(request) == ("2024-01-02-08:00", "2024-01-02-09:00") and not parse_cursor(released.cursor).held


def test_range_requests_make_one_run_per_partitioning():
    from laminar_assets.engine import Agg, FlowSpec, Tumbling

    daily = FlowSpec(name="daily_counts", source="normalized_trades", event_time="event_time",
                     window=Tumbling("1h"), aggregates=(Agg.count(),), partitioning="daily")
    reqs = range_requests({BY_NAME["vwap_1m"]: ["2024-01-03-05:00"], BY_NAME["ohlc_5m"]: ["2024-01-03-01:00"],
                           daily: ["2024-01-03"]}, SETTINGS, run_key="k")
    assert sorted((span(r), len(r.asset_selection)) for r in reqs) == [
        (("2024-01-03", "2024-01-03"), 1), (("2024-01-03-01:00", "2024-01-03-05:00"), 2)]


def test_schedule_requests_the_current_partition():
    _job, schedule = build_schedule(BY_NAME["vwap_1m"], "*/15 * * * *", SETTINGS, "raw_trades")
    from datetime import datetime

    ctx = dg.build_schedule_context(scheduled_execution_time=datetime(2024, 1, 2, 10, 45, tzinfo=UTC))
    request = schedule(ctx)
    assert request.partition_key == "2024-01-02-10:00" and request.tags["laminar/component"] == "raw_trades"
    # the job is partitioned like its asset (inferred from the selection), so the request's key is valid
    from laminar_assets.definitions import build_definitions

    defs = build_definitions(SPECS, LaminarSettings(schedules={"vwap_1m": "*/15 * * * *"}))
    job = defs.resolve_job_def("vwap_1m_latest")
    assert job.partitions_def == partitions_def(BY_NAME["vwap_1m"], LaminarSettings())
    assert job.partitions_def.has_partition_key(request.partition_key)


def test_new_commits_stops_at_the_version_the_tick_read(lake):
    from laminar_assets.engine.report.staleness import new_commits

    create_sources(lake, BASE)
    lake.append("raw_trades", frame=trades([(10, "2024-01-02 10:06:00", "MSFT", "ACC-3", "BUY", 411.0, 100)]))
    assert new_commits(lake.root, "raw_trades", "event_time", 0, upto=0) is None  # landed after the tick began
    assert new_commits(lake.root, "raw_trades", "event_time", 0).to_version == 1


def test_single_partition_requests_name_the_partition():
    [req] = range_requests({BY_NAME["vwap_1m"]: ["2024-01-03-05:00"]}, SETTINGS, run_key="k")
    assert req.partition_key == "2024-01-03-05:00" and RANGE_START not in req.tags


def test_changes_before_partitions_start_are_reported_not_dropped_quietly():
    from laminar_assets.orchestration.sensors import outside_partitions

    late_start = LaminarSettings(partitions_start=datetime(2024, 1, 2, 10))
    dirty = {BY_NAME["vwap_1m"]: ["2024-01-02-09:00", "2024-01-02-10:00"]}
    assert outside_partitions(dirty, late_start) == {"vwap_1m": (["2024-01-02-09:00"], datetime(2024, 1, 2, 10, tzinfo=UTC))}
    assert outside_partitions(dirty, SETTINGS) == {}
    # a flow's own start wins over the project's
    own = {dataclasses.replace(BY_NAME["vwap_1m"], start="2024-01-02T10:00"): dirty[BY_NAME["vwap_1m"]]}
    assert outside_partitions(own, SETTINGS) == {"vwap_1m": (["2024-01-02-09:00"], datetime(2024, 1, 2, 10, tzinfo=UTC))}


def test_changes_after_the_current_partition_are_not_blamed_on_the_start():
    """A row dated in the future (a wrong clock, year 9999) makes partitions up to now + future_horizon dirty;
    the warning said to set the start earlier, which cannot include them."""
    from laminar_assets.orchestration.sensors import outside_message

    start = datetime(2024, 1, 2, 10, tzinfo=UTC)
    future = outside_message("vwap_1m", ["2024-01-05-06:00", "2024-01-05-07:00"], start)
    assert "2 after the current one (2024-01-05-06:00..2024-01-05-07:00): event times in the future" in future
    assert "start" not in future.split(": event times")[1] and "earlier" not in future
    both = outside_message("vwap_1m", ["2024-01-02-09:00", "2024-01-05-06:00"], start)
    assert "1 before its first partition (2024-01-02-09:00..2024-01-02-09:00; it starts at 2024-01-02 10:00): set the " \
           "flow's start" in both and "1 after the current one (2024-01-05-06:00..2024-01-05-06:00)" in both
    assert "2 before" in outside_message("daily", ["2024-01-01", "2024-01-02"], datetime(2024, 1, 3, tzinfo=UTC))


def test_flows_with_their_own_start_run_apart_from_the_rest_of_their_part():
    """Dagster runs only assets of one partitions definition together: a flow with its own start gets
    its own run, and every run's partition keys exist in its assets' partitions."""
    from laminar_assets.definitions import build_definitions

    late = dataclasses.replace(BY_NAME["ohlc_5m"], start="2024-01-02")
    dirty = {BY_NAME["vwap_1m"]: ["2024-01-02-05:00"], BY_NAME["positions_1h"]: ["2024-01-02-06:00"],
             late: ["2024-01-02-05:00", "2024-01-02-07:00"]}
    reqs = range_requests(dirty, SETTINGS, run_key="k")
    assert sorted(tuple(a.path[0] for a in r.asset_selection) for r in reqs) == [("ohlc_5m",), ("vwap_1m", "positions_1h")]
    assert len({r.run_key for r in reqs}) == 2
    defs = build_definitions([late if s.name == "ohlc_5m" else s for s in SPECS], SETTINGS)
    pdefs = {spec.key: spec.partitions_def for spec in defs.resolve_all_asset_specs()}
    for req in reqs:  # Dagster builds each request's job: its assets share one partitions definition
        [pdef] = {pdefs[key] for key in req.asset_selection}
        keys = [req.partition_key] if req.partition_key else [req.tags[RANGE_START], req.tags[RANGE_END]]
        assert all(pdef.has_partition_key(k) for k in keys)
    assert {pdefs[dg.AssetKey("ohlc_5m")].start.isoformat(), pdefs[dg.AssetKey("vwap_1m")].start.isoformat()} == {
        "2024-01-02T00:00:00+00:00", "2024-01-01T00:00:00+00:00"}
