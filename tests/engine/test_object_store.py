"""The engine with the whole lake in a bucket (a local S3 server): sources, stages, sinks, state,
quarantine, watermarks, leases and uncommitted files. Nothing is written to a local disk, incremental
runs equal a recompute, and two runs of one partition never both commit."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Agg, Engine, FlowSpec, Mode, Reason, StageSpec, Tumbling
from laminar_assets.errors import ConcurrentRunError, StorageError
from laminar_assets.storage import ObjectStoreOptions, registry
from tests.conftest import Lake
from tests.lake_invariants import assert_lake_intact, assert_no_orphans
from tests.object_store import using
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

H0, H1 = "2024-01-01-00:00", "2024-01-01-01:00"
FLOW = FlowSpec(name="per_sym", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px"), Agg.count_distinct("qty")))
RETRACTING = FlowSpec(name="sums", source="trades", event_time="ts", window=Tumbling("15m"), keys=("sym",),
                      aggregates=(Agg.count(), Agg.sum("px")))
STAGE = StageSpec(name="clean", source="trades", event_time="ts", filter="qty > 0")
BASE = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:12:00", "b", 2.0, 2),
        ("2024-01-01 01:05:00", "a", 3.0, 3), (None, "c", 1.0, 1)]


def _matches_recompute(spark, lake: Lake, flow: FlowSpec, *, until: str = "2024-01-01 02:00") -> None:
    """The sink equals a recompute of the windows starting before `until` (the partitions run)."""
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    if len(expected):
        expected = expected[expected["window_start"] < until]
    assert_frames_match(lake.read(flow.sink), expected, flow.keys)


def test_a_lake_in_a_bucket_runs_incrementally_and_equals_a_recompute(spark, s3_lake, tmp_path):
    lake = s3_lake
    lake.create("trades", BASE)
    engine = Engine(spark, lake.root)
    first = engine.run_many(FLOW, [H0, H1])
    assert [r.reason for r in first] == [Reason.NO_WATERMARK] * 2
    lake.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4), ("2024-01-01 01:06:00", "b", 5.0, 1)])
    assert [r.reason for r in engine.run_many(FLOW, [H0, H1])] == [Reason.APPEND_ONLY] * 2
    lake.delete("trades", "qty = 2")  # change data: the retracting flow merges, COUNT(DISTINCT) refills
    assert engine.run(RETRACTING, H0).reason is Reason.NO_WATERMARK
    assert [r.reason for r in engine.run_many(FLOW, [H0, H1])][0] is Reason.NON_APPEND_ON_NON_RETRACTABLE
    lake.update("trades", {"px": "px + 1.0"}, "sym = 'a'")
    assert engine.run(RETRACTING, H0).reason is Reason.RETRACTABLE_CHANGES
    engine.run_many(FLOW, [H0, H1])
    engine.run_many(STAGE, [H0, H1])  # a stage's change-data commit is written with a put-if-absent
    lake.delete("trades", "qty = 4")
    assert engine.run_many(STAGE, [H0, H1])[0].mode is Mode.REFILL
    engine.run_many(FLOW, [H0, H1])
    engine.run(RETRACTING, H0)

    _matches_recompute(spark, lake, FLOW)
    _matches_recompute(spark, lake, RETRACTING, until="2024-01-01 01:00")
    stage = lake.read("clean")
    source = lake.table("trades").to_pandas()
    assert sorted(stage["px"]) == sorted(source[(source["qty"] > 0) & source["ts"].notna()]["px"])
    quarantine = open_table(lake, "_laminar/quarantine/trades").to_pandas()
    assert set(quarantine["rule"]) == {"event_time_missing"}
    assert_lake_intact(lake.root)
    assert_no_orphans(lake.root, ["per_sym", "sums", "clean"])
    assert CheckpointStore(lake.root).partitions("per_sym") == [H0, H1]
    assert all(t.ok for t in engine.integrity(FLOW))
    # nothing of the lake was written to a local disk: state, uncommitted files, watermarks are all in the bucket
    assert not [p for p in os.listdir(tmp_path) if p != "lake"] and not os.path.exists(tmp_path / "lake")
    keys = [u for u, _ in storage.list_files(lake.root)]
    assert any("/_laminar/watermarks/per_sym/" in k for k in keys) and any("/_laminar/state/per_sym/" in k for k in keys)


def open_table(lake: Lake, name: str):
    from laminar_assets.engine.delta import open_delta

    return open_delta(lake.path(name))


def test_a_run_whose_lease_was_taken_over_does_not_commit_twice(spark, s3_lake, monkeypatch):
    """The claim is the first guard; the run sequence in every Delta commit is the second. A run whose
    partition another run took over (its holder looked gone) finds its sequence committed and gives up:
    nothing of it lands, the other run's result stands, and a rerun continues."""
    lake = s3_lake
    lake.create("trades", BASE)
    Engine(spark, lake.root).run(FLOW, H0)
    lake.append("trades", [("2024-01-01 00:03:00", "a", 7.0, 5)])

    def takeover(step):
        if step == "after_read":  # meanwhile, another run finds the holder gone and does the same work
            monkeypatch.setattr(CheckpointStore, "holder_gone", lambda self, holder, flow, partition: True)
            Engine(spark, lake.root).run(FLOW, H0)
            monkeypatch.undo()

    with pytest.raises(ConcurrentRunError, match="another run committed run 2 of laminar/per_sym/2024-01-01-00:00"):
        Engine(spark, lake.root, hook=takeover).run(FLOW, H0)
    assert CheckpointStore(lake.root).load("per_sym", H0).seq == 2
    assert Engine(spark, lake.root).run(FLOW, H0).mode is Mode.NOOP
    _matches_recompute(spark, lake, FLOW, until="2024-01-01 01:00")
    assert_no_orphans(lake.root, ["per_sym"])


# Each racer is a Spark Connect client of the test process's server (up in a second or two, where a JVM
# of its own took ~15 s). It says "ready" once its engine is built, then waits for the word to go on
# stdin: both start the same partition's run at the same moment, whatever each took to get ready.
_RACER = textwrap.dedent("""
    import json, sys
    from laminar_assets.engine import Agg, Engine, FlowSpec, SparkOptions, Tumbling, build_session
    from laminar_assets.errors import LaminarError
    from laminar_assets.process_exit import run_then_exit
    from laminar_assets.storage import ObjectStoreOptions
    def main():
        root, endpoint, key, secret, remote = sys.argv[1:6]
        spark = build_session(SparkOptions(remote=remote, shuffle_partitions=1))
        flow = FlowSpec(name="per_sym", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                        aggregates=(Agg.count(), Agg.sum("px"), Agg.count_distinct("qty")))
        store = ObjectStoreOptions(endpoint=endpoint, access_key_id=key, secret_access_key=secret, path_style=True)
        engine = Engine(spark, root, store=store)
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            result = engine.run(flow, "2024-01-01-00:00")
            print(json.dumps({"committed": result.mode.value}))
        except LaminarError as exc:
            print(json.dumps({"error": type(exc).__name__, "retryable": exc.retryable, "message": exc.message}))
    run_then_exit(main)  # its exit code is its own, not a teardown's abort (docs/known-limits.md, "Exit codes")
""")


def test_two_processes_racing_on_one_partition_commit_once(spark, s3proxy_server, connect_server):
    """Against a server whose put-if-absent is honest (s3proxy): two processes start the same
    partition's run at the same moment; exactly one commits, the other fails with a retryable error."""
    from tests.object_store import KEY, SECRET

    with using(s3proxy_server):
        lake = Lake(s3proxy_server.bucket())
        lake.create("trades", BASE)
        procs = [subprocess.Popen([sys.executable, "-c", _RACER, lake.root, s3proxy_server.endpoint, KEY, SECRET,
                                   connect_server.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for proc in procs:  # both ready, within two minutes
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            line = proc.stdout.readline() if ready else ""
            assert line.strip() == "ready", (line, proc.poll(), "" if ready else "no word within 120 s")
        outputs = []
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
            outputs.append(__import__("json").loads(out.strip().splitlines()[-1]))
        committed = [o for o in outputs if "committed" in o]
        failed = [o for o in outputs if "error" in o]
        assert len(committed) == 1 and len(failed) == 1, outputs
        assert failed[0]["retryable"] and failed[0]["error"] == "ConcurrentRunError", failed
        assert CheckpointStore(lake.root).load("per_sym", H0).seq == 1
        _matches_recompute(spark, lake, FLOW, until="2024-01-01 01:00")
        assert_lake_intact(lake.root)


def test_a_store_that_cannot_be_used_fails_before_anything_is_written(spark, s3_server, s3proxy_server):
    unreachable = ObjectStoreOptions(endpoint="http://127.0.0.1:1", access_key_id="k", secret_access_key="s")
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"s3://lake/root: cannot connect to http://127\.0\.0\.1:1"):
        Engine(spark, "s3://lake/root", store=unreachable)
    assert time.monotonic() - started < 20
    with using(s3_server):
        with pytest.raises(StorageError, match="bucket 'missing' does not exist"):
            Engine(spark, "s3://missing/lake")
    bucket = s3proxy_server.bucket()
    with pytest.raises(StorageError, match="refused the credentials"):
        Engine(spark, bucket, store=ObjectStoreOptions(endpoint=s3proxy_server.endpoint, access_key_id="nobody",
                                                       secret_access_key="nope"))
    with using(s3proxy_server):
        assert storage.list_files(bucket) == []  # nothing was written, and the refused store was not mounted


def test_two_engines_on_two_stores_share_one_process_and_one_spark_session(spark, s3_server, second_s3_server):
    """Each engine mounts its store at its root and sets Spark's per-bucket settings of its root's bucket:
    with both built before either runs, each run reads, stages and commits on its own server (one process
    store, or one set of s3a settings, would send one of them to the other's endpoint, which has no such
    bucket). Object stores Laminar has no `Store` for are refused by name, before anything is done."""
    lakes = {"one": Lake(s3_server.bucket()), "two": Lake(second_s3_server.bucket())}
    engines = {"one": Engine(spark, lakes["one"].root, store=s3_server.options),
               "two": Engine(spark, lakes["two"].root, store=second_s3_server.options)}
    assert engines["one"].storage is not engines["two"].storage
    lakes["one"].create("trades", BASE)
    lakes["two"].create("trades", [("2024-01-01 00:07:00", "z", 9.0, 9)])
    for name in ("one", "two"):
        assert [r.reason for r in engines[name].run_many(FLOW, [H0, H1])] == [Reason.NO_WATERMARK] * 2
    more = {"two": [("2024-01-01 00:08:00", "z", 1.0, 1), ("2024-01-01 01:08:00", "z", 1.5, 1)],
            "one": [("2024-01-01 00:09:00", "a", 2.0, 2), ("2024-01-01 01:09:00", "b", 2.5, 2)]}
    for name, rows in more.items():
        lakes[name].append("trades", rows)
        assert [r.reason for r in engines[name].run_many(FLOW, [H0, H1])] == [Reason.APPEND_ONLY] * 2
    for name in ("one", "two"):
        _matches_recompute(spark, lakes[name], FLOW)
        assert_lake_intact(lakes[name].root)
    for server, mine, theirs in ((s3_server, "one", "two"), (second_s3_server, "two", "one")):
        buckets = [b["Name"] for b in server.options.client().list_buckets()["Buckets"]]
        assert lakes[mine].root.split("/")[2] in buckets and lakes[theirs].root.split("/")[2] not in buckets
    for uri in ("gcs://bucket/lake", "adl://account.azuredatalakestore.net/lake"):  # (gs://, abfss:// served)
        with pytest.raises(StorageError, match=f"{uri.split(':')[0]}:// is not supported yet") as info:
            Engine(spark, uri)
        assert uri in str(info.value)


def test_a_source_in_another_bucket_is_reached_with_the_engines_store(spark, s3_server, monkeypatch):
    """A source named by absolute URI in another bucket of the store the engine was given (options, not
    the environment, which points nowhere here): deltalake and the file I/O reach it through the one
    store mounted for s3://, and Spark through the per-bucket settings the run sets for the source's
    bucket (before, only the root's bucket had them and Spark's read went to AWS)."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    # one lake in this process, as a deployment has: the stores earlier tests of this process mounted
    # (other servers, other credentials) are out of the table while this one runs
    monkeypatch.setattr(registry, "_mounts", {})
    root, elsewhere = s3_server.bucket(), s3_server.bucket("sources")
    engine = Engine(spark, root, store=s3_server.options)
    source = Lake(elsewhere)
    source.create("trades", BASE)
    flow = FlowSpec(name="per_sym_elsewhere", source=f"{elsewhere}/trades", event_time="ts", window=Tumbling("10m"),
                    keys=("sym",), aggregates=(Agg.count(), Agg.sum("px")))
    assert [r.reason for r in engine.run_many(flow, [H0, H1])] == [Reason.NO_WATERMARK] * 2
    source.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4)])
    assert engine.run(flow, H0).reason is Reason.APPEND_ONLY
    expected = full_recompute(spark, flow, source.table("trades").to_pyarrow_table())
    expected = expected[expected["window_start"] < "2024-01-01 02:00"]
    assert_frames_match(Lake(root).read(flow.sink), expected, flow.keys)


def test_the_state_of_every_aggregate_kind_read_by_the_driver_merges_as_spark_reads_it(spark, s3_lake, monkeypatch):
    """In a bucket, a pass's small committed state is read by the driver and handed to Spark as rows (no HEAD per
    file: `EngineOptions.driver_read_below_bytes`): every aggregate kind's state (sketches, sets, structs of
    extremes) comes through it unchanged, so appends, deletes and updates merged into it equal a full recompute.
    0 turns it off: Spark reads the files."""
    from laminar_assets.engine import EngineOptions
    from laminar_assets.engine.flow import state as flow_state
    from tests.engine.test_differential import FLOWS

    flows = [f for f in FLOWS if isinstance(f, FlowSpec) and f.name in ("tumble_all", "hop_other")]
    handed: list = []
    real = flow_state.read_in_driver
    monkeypatch.setattr(flow_state, "read_in_driver", lambda *a, **kw: handed.append(r := real(*a, **kw)) or r)
    lake = s3_lake
    lake.create("trades", BASE[:3] + [("2024-01-01 00:14:00", "c", 7.5, 2), ("2024-01-01 01:40:00", "a", 2.5, 5)])
    engine, keys = Engine(spark, lake.root), ["2023-12-31-23:00", H0, H1]  # the hopping flow's first windows: the day before
    for flow in flows:
        engine.run_many(flow, keys)
    for step in (lambda: lake.append("trades", [("2024-01-01 00:03:00", "b", 9.0, 1), ("2024-01-01 01:07:00", "c", 4.0, 2)]),
                 lambda: lake.delete("trades", "qty = 2"),
                 lambda: lake.update("trades", {"px": "px * 2.0"}, "sym = 'a'"),
                 lambda: lake.append("trades", [("2024-01-01 00:55:00", "a", 0.5, 3)])):
        step()
        for flow in flows:
            engine.run_many(flow, keys)
    assert sum(1 for t in handed if t is not None and t.num_rows) >= 4, handed  # state merged from the driver's rows
    for flow in flows:
        _matches_recompute(spark, lake, flow)
    handed.clear()
    lake.append("trades", [("2024-01-01 01:12:00", "b", 3.0, 1)])
    Engine(spark, lake.root, options=EngineOptions(driver_read_below_bytes=0)).run_many(flows[0], keys)
    assert handed == []
    _matches_recompute(spark, lake, flows[0])
