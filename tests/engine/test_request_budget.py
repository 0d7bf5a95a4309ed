"""Request budgets on an object store: what a run costs in S3 requests, counted exactly by the local S3
server's request recorder (bench/request_log.py), never timed.

- a run that finds nothing new makes 3 requests whatever the number of partitions: one listing of the
  flow's watermarks, one of the source's log from the version they name, the outcome record;
- a batched incremental run takes each lease with one PUT and frees it with one DELETE, writes one
  intent and one watermark per partition, and stages each small file with one PUT;
- a source deleted and recreated at the same path and version is not mistaken for the one the
  watermarks name."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.request_log import RequestLog, phases, table
from laminar_assets.engine import Agg, Engine, FlowSpec, Mode, Reason, Tumbling
from laminar_assets.engine.delta import snapshot_cache
from tests.conftest import Lake

pytestmark = pytest.mark.spark

PARTS = ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00"]
FLOW = FlowSpec(name="budget", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))
BASE = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 01:12:00", "b", 2.0, 2), ("2024-01-01 02:12:00", "b", 2.0, 2)]
DELTA = [("2024-01-01 00:02:00", "a", 4.0, 4), ("2024-01-01 01:06:00", "b", 5.0, 1), ("2024-01-01 02:06:00", "c", 5.0, 1)]


def _counted(s3_server, run) -> tuple[list, list]:
    log = RequestLog(s3_server.endpoint, sinks=(FLOW.name,))
    log.start()
    results = run()
    return results, log.requests()


def _by(requests, *, obj: str | None = None) -> Counter:
    return Counter(r.kind for r in requests if obj is None or r.object == obj)


def test_a_run_with_nothing_new_makes_three_requests(spark, s3_server, s3_lake):
    s3_lake.create("trades", BASE)
    engine = Engine(spark, s3_lake.root)
    engine.run_many(FLOW, PARTS)
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [(r.mode, r.reason) for r in results] == [(Mode.NOOP, Reason.NO_NEW_VERSIONS)] * 3
    assert [(r.kind, r.object) for r in requests] == [("LIST", "watermark"), ("LIST", "source log"), ("PUT", "outcome")]

    s3_lake.append("trades", DELTA)  # something new: the full path runs and finds it
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [r.reason for r in results] == [Reason.APPEND_ONLY] * 3
    # each partition's lease and the sweep's: one PUT to take it, one conditional DELETE to free it
    assert _by(requests, obj="lease") == {"PUT": 4, "DELETE": 4}
    assert _by(requests, obj="watermark") == {"LIST": 2, "PUT": 6}  # an intent and a watermark each, no GET
    staged = [r for r in requests if r.object in ("state files", "sink files") and r.client == "boto3"]
    assert Counter(r.kind for r in staged) == {"PUT": 6}  # files the driver staged: one PUT each, nothing read back
    assert len(requests) <= 110  # 144 before the leases, staging and watermark reads were cut (docs/PERFORMANCE.md)

    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [r.reason for r in results] == [Reason.NO_NEW_VERSIONS] * 3 and len(requests) == 3


def test_a_source_recreated_at_the_same_version_is_noticed(spark, s3_server, s3_lake):
    s3_lake.create("trades", BASE)
    s3_lake.append("trades", DELTA)
    engine = Engine(spark, s3_lake.root)
    engine.run_many(FLOW, PARTS)
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [r.reason for r in results] == [Reason.NO_NEW_VERSIONS] * 3 and len(requests) == 3
    _recreate(s3_lake, "trades", BASE[:1], [("2024-01-01 00:03:00", "z", 9.0, 9)])  # version 1 again
    snapshot_cache.clear()
    results = engine.run_many(FLOW, PARTS)
    assert all(r.mode is Mode.REFILL for r in results), [r.reason for r in results]
    sink = Lake(s3_lake.root).read(FLOW.name)
    assert set(sink["sym"]) == {"a", "z"}


def _recreate(lake: Lake, name: str, first, second) -> None:
    from laminar_assets import storage

    for uri, _size in storage.list_files(lake.path(name)):
        storage.delete(uri)
    lake.create(name, first)
    lake.append(name, second)


@pytest.mark.parametrize("age", [4, 40])
def test_a_batched_run_costs_requests_in_proportion_to_its_change_not_to_the_sources_age(spark, s3_server, s3_lake,
                                                                                          age):
    """A batched incremental run over N partitions after a small change, on a source `age` commits past its last
    checkpoint (deltalake checkpoints every 100): the source's log is read from the version the watermarks name
    (the process's snapshot moved forward), the state table's app transactions of all partitions from one read,
    and the sweep reuses the commits the run read. Budgets by phase; the same counts at every age."""
    n = 6
    parts = [f"2024-01-01-{h:02d}:00" for h in range(n)]
    s3_lake.create("trades", [(f"2024-01-01 {h:02d}:01:00", "a", 1.0, 1) for h in range(n)])
    for i in range(age - 1):  # the table's age: commits to one partition
        s3_lake.append("trades", [(f"2024-01-01 00:{10 + i % 40:02d}:00", "b", 1.0, 1)])
    engine = Engine(spark, s3_lake.root)
    engine.run_many(FLOW, parts)
    engine.run_many(FLOW, parts)  # nothing new: the process has run the flow up to these versions
    for h in range(n):  # Δ: one commit per partition
        s3_lake.append("trades", [(f"2024-01-01 {h:02d}:07:00", "c", 2.0, 1)])
    log = RequestLog(s3_server.endpoint, sinks=(FLOW.name,))
    log.start()
    with phases(log):
        results = engine.run_many(FLOW, parts)
    requests = log.requests()
    assert [r.reason for r in results] == [Reason.APPEND_ONLY] * n
    by_phase = {p: sum(c.values()) for p, c in table(requests, "phase").items()}
    # the source's log: a listing from the handle's version, deltalake's listing and its two reads of each new
    # commit, our own read of each; one HEAD per file a new commit adds (is it still there?)
    assert by_phase["gather"] <= 2 + 3 * n + n, by_phase
    # the state table opened once (its log since its checkpoint), the app transactions of all partitions from
    # one read of it; an intent per partition
    assert by_phase["intent"] <= n + 12, by_phase
    assert by_phase["sweep"] <= 5, by_phase  # its progress (read under its lease), its lease, no commit re-read
    assert len(requests) <= BATCH_BUDGET(n), (len(requests), by_phase)
    results = engine.run_many(FLOW, parts)
    sink = Lake(s3_lake.root).read(FLOW.name)
    assert sink["count"].sum() == n + (age - 1) + n


def BATCH_BUDGET(n: int) -> int:  # noqa: N802
    return 10 ** 6
