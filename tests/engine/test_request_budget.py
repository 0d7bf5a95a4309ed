"""Request budgets on an object store: what a run costs in S3 requests, counted exactly by the local S3
server's request recorder (bench/request_log.py), never timed.

- a run that finds nothing new makes 3 requests whatever the number of partitions: one listing of the
  flow's watermarks, one of the source's log from the version they name, the outcome record;
- a batched incremental run takes each lease with one PUT and frees it with one DELETE, writes one
  intent and one watermark per partition, and writes each small file with one PUT;
- a source deleted and recreated at the same path and version is not mistaken for the one the
  watermarks name;
- a new process (each run the daemon launches) answers a run with nothing new from the watermarks and the
  logs' listings, and opens a source at its checkpoint: each commit since read once."""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter

import pyarrow as pa
import pytest
from py4j.protocol import Py4JError

from bench.request_log import RequestLog, phases, table
from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Mode, Reason, Tumbling
from laminar_assets.engine.delta import snapshot_cache
from laminar_assets.engine.delta.deletion_vectors import DeletedRows
from laminar_assets.engine.delta.tables import snapshot_files, table_info
from laminar_assets.engine.spark import read as spark_read
from laminar_assets.engine.spark.read import read_source
from laminar_assets.engine.spark.session import use_object_store
from tests.conftest import Lake
from tests.engine.new_process import as_a_new_process, on_a_new_machine

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
    # the read of the block holding the three watermarks (a week of hourly partitions), the source log's listing
    # from their version, the outcome record
    assert [(r.kind, r.object) for r in requests] == [("GET", "watermark"), ("LIST", "source log"), ("PUT", "outcome")]

    s3_lake.append("trades", DELTA)  # something new: the full path runs and finds it
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [r.reason for r in results] == [Reason.APPEND_ONLY] * 3
    # no lease object: a partition's watermark is its lease (its intent claims it, its watermark frees it, both
    # conditional writes); the sweep takes none (the new commit's statistics prove every event time present and in
    # bounds: one conditional write of its progress)
    assert not _by(requests, obj="lease")
    assert _by(requests, obj="sweep") == {"PUT": 1}
    # the NOOP check's read of their block (the run's writes are conditional on the revisions it gave), then the
    # three intents in one write of the block, the three watermarks in another (6 writes while each had its file)
    assert _by(requests, obj="watermark") == {"GET": 1, "PUT": 2}
    written = [r for r in requests if r.object in ("state files", "sink files") and r.kind != "GET"]
    assert Counter(r.kind for r in written) == {"PUT": 6}  # files the driver wrote: one PUT each, nothing read back
    # Spark's reads: one HEAD and one GET of the source's new file, no listing; the 3 partitions' state files read
    # by the driver (one GET each, their sizes from the log) and handed to Spark as rows
    assert _by([r for r in requests if r.client == "s3a"]) == {"HEAD": 1, "GET": 1}
    assert _by([r for r in requests if r.object == "state files" and r.kind == "GET"]) == {"GET": 3}
    # 144 before the requests for leases and uncommitted files and the watermark reads were cut, 83 before Spark's
    # file index came from the log, 71 before the source's new commit was read once and the commits stopped listing
    # the log for its clean-up (docs/PERFORMANCE.md)
    assert _by(requests, obj="source log") == {"LIST": 1, "GET": 1}  # the NOOP check's listing, one read
    # each commit (state, sink) is one PUT of its log entry: no listing before it, no read-back after (`write_commit`)
    for log_of in ("state log", "sink log"):
        assert _by([r for r in requests if r.client == "boto3"], obj=log_of)["PUT"] == 1
        assert not [r for r in requests if r.object == log_of and r.client == "deltalake" and r.kind == "PUT"]
    # 40 while deltalake opened the state and sink tables (the pointer, a listing and each commit twice, then a
    # listing for the tag of its version and the commits again for their app transactions: 10 each, now 4:
    # `log_snapshot`), 66 while the sweep took its lease, 63 while deltalake made the commits (five requests each), 55 while each
    # partition had a lease object (a PUT and a DELETE) and the run listed the watermarks again under them, 48
    # while the sink's commit listed its log again after the owner check had, 47 while each partition's watermark
    # was its own object (an intent and a watermark each: 6 writes, not 2), 43 while Spark read the state files
    # (a HEAD each more), 28 while each run read the state and sink tables' logs again (the checkpoint pointer and
    # each commit since the checkpoint: now a listing from the checkpoint this machine last replayed from, and the
    # commits from its copies, `storage.copies`)
    for log_of in ("state log", "sink log"):
        assert _by(requests, obj=log_of) == {"LIST": 1, "PUT": 1}
    assert len(requests) == 22, Counter((r.object, r.kind) for r in requests)

    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, PARTS))
    assert [r.reason for r in results] == [Reason.NO_NEW_VERSIONS] * 3 and len(requests) == 3

    # a new hour's first rows: its partition has no watermark, so the check that nothing moved lists nothing before
    # the run; the run's own listing of the source (its checkout) tells the next check where it stopped, with no
    # listing after the run (one each before `unchanged.remember` took the run's snapshots)
    s3_lake.append("trades", [("2024-01-01 03:04:00", "d", 1.0, 1)])
    parts = [*PARTS, "2024-01-01-03:00"]
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, parts))
    assert results[-1].reason is Reason.NO_WATERMARK
    assert _by(requests, obj="source log") == {"LIST": 1, "GET": 1}
    results, requests = _counted(s3_server, lambda: engine.run_many(FLOW, parts))
    assert [r.reason for r in results] == [Reason.NO_NEW_VERSIONS] * 4 and len(requests) == 3


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


def test_a_new_process_answers_a_run_with_nothing_new_from_the_watermarks(spark, s3_server, s3_lake):
    s3_lake.create("trades", BASE)
    Engine(spark, s3_lake.root).run_many(FLOW, PARTS)  # the first run: its watermarks name no commit file
    s3_lake.append("trades", DELTA)
    Engine(spark, s3_lake.root).run_many(FLOW, PARTS)
    as_a_new_process()
    results, requests = _counted(s3_server, lambda: Engine(spark, s3_lake.root).run_many(FLOW, PARTS))
    assert [(r.mode, r.reason) for r in results] == [(Mode.NOOP, Reason.NO_NEW_VERSIONS)] * 3
    # the engine's check that the bucket answers; the read of the watermarks' block, the source log's listing from
    # their version (its newest commit file has the tag the watermarks name), the sweep's progress, the outcome
    # record. 32 while only the process that ran the flow could answer so (the full path: every table opened), 10
    # while each watermark was its own object (a listing, then a read of each)
    assert [(r.kind, r.object) for r in requests] == (
        [("HEAD", "source listing"), ("GET", "watermark"), ("LIST", "source log"), ("GET", "sweep"), ("PUT", "outcome")])
    _recreate(s3_lake, "trades", BASE[:1], [("2024-01-01 00:03:00", "z", 9.0, 9)])  # version 1 again
    as_a_new_process()
    results = Engine(spark, s3_lake.root).run_many(FLOW, PARTS)
    assert all(r.mode is Mode.REFILL for r in results), [r.reason for r in results]  # another commit file there
    assert set(Lake(s3_lake.root).read(FLOW.name)["sym"]) == {"a", "z"}


@pytest.mark.parametrize(("machine", "age"), [("same", 4), ("same", 40), ("new", 40)])
def test_a_batched_run_in_a_new_process_reads_each_source_commit_since_the_checkpoint_once(
        spark, s3_server, s3_lake, machine, age):
    """The deployment's run (a new process) over 6 partitions. On a machine that keeps no copies of the logs
    (`machine="new"`), its source is replayed from its last checkpoint (none here: deltalake writes one every 100
    commits, so from version 0), each commit read once, side by side (`snapshot_cache._from_checkpoint`):
    opening it at its latest version read each twice, one after another (2 x commits + 2). So the count grows by
    one request per commit since the source's checkpoint, which the source's writer decides (Laminar's own tables
    checkpoint every 10 commits). On the machine that ran the last run (the daemon's), the commits that run read
    are read from its copies (`storage.copies`), and the log is listed from the checkpoint that run started from
    (no pointer): the count does not grow with the table's age."""
    n = 6
    parts = [f"2024-01-01-{h:02d}:00" for h in range(n)]
    s3_lake.create("trades", [(f"2024-01-01 {h:02d}:01:00", "a", 1.0, 1) for h in range(n)])
    for i in range(age - 1):
        s3_lake.append("trades", [(f"2024-01-01 00:{10 + i % 40:02d}:00", "b", 1.0, 1)])
    Engine(spark, s3_lake.root).run_many(FLOW, parts)
    for h in range(n):
        s3_lake.append("trades", [(f"2024-01-01 {h:02d}:07:00", "c", 2.0, 1)])
    on_a_new_machine() if machine == "new" else as_a_new_process()
    log = RequestLog(s3_server.endpoint, sinks=(FLOW.name,))
    log.start()
    with phases(log):
        results = Engine(spark, s3_lake.root).run_many(FLOW, parts)
    requests = log.requests()
    assert [r.reason for r in results] == [Reason.APPEND_ONLY] * n
    commits = age - 1 + n  # the source's commits after version 0
    gather = [r for r in requests if r.phase == "gather"]
    names = Counter(r.key.rsplit("/", 1)[-1] for r in gather if r.kind == "GET")
    if machine == "new":
        # the checkpoint pointer, the log's listing from it, every commit once (version 0 too); the 6 new ones
        # are the run's history as well (not read again). deltalake's open at version 0 added its own pointer,
        # listing and two reads of version 0.
        assert _by(gather) == {"GET": 2 + commits, "LIST": 1}, Counter((r.key.rsplit("/", 1)[-1], r.client) for r in gather)
    else:
        # one listing from the checkpoint the last run started from, the 6 commits nobody on this machine read
        assert _by(gather) == {"GET": n, "LIST": 1}, Counter((r.key.rsplit("/", 1)[-1], r.client) for r in gather)
    assert names[f"{commits:020d}.json"] == 1
    # 111 at age 4 and 183 at age 40 while the source was opened at its latest version (with the engine's check
    # that the bucket answers, a HEAD); 89 + commits while the sink's commit listed its log again after the owner
    # check had, 88 + commits while each partition's watermark was its own object (a listing and 6 reads of them,
    # 6 intents and 6 watermarks written: now a read and two writes of their block), 72 + commits while Spark read
    # the state files (a HEAD each more), 66 + commits while deltalake opened the state and sink tables (10
    # requests each: now the pointer, a listing and each commit once, `log_snapshot`), 54 + commits while
    # deltalake opened the source at its checkpoint. On the daemon's machine 49 whatever the source's age (63 and 99
    # before the copies): the commits and checkpoints of the source, state and sink that it read or wrote before
    # are not read again, and no pointer is read.
    expected = 51 + commits if machine == "new" else 49
    assert len(requests) == expected, (len(requests), {p: dict(c) for p, c in table(requests, "phase").items()})


def test_spark_reads_a_logged_file_with_two_requests_and_never_drops_one(spark, s3_server, s3_lake, monkeypatch):
    """Spark's scan of the files a Delta log names (`engine.spark.read.scan_files`): their index is built from the log's
    paths and sizes, so each file costs the task's HEAD and GET only (five through `spark.read.parquet`: a HEAD for
    the path's existence, a LIST and a HEAD for its index); the rows are the files' own. A file whose size the
    log leaves out is listed by Spark: an index that took it as empty would skip it (Spark reads no empty file). The
    scan's metadata columns (row positions for deleted rows, file names) come through as from Spark's own index."""
    s3_lake.create("trades", BASE)
    s3_lake.append("trades", DELTA)
    use_object_store(spark, s3_lake.root)  # as an engine on this root does: s3a reaches the bucket
    info = table_info("trades", s3_lake.path("trades"))
    files = snapshot_files(info, None)
    assert len(files) == 2 and all(f.size > 0 for f in files)

    def read(of):
        return sorted(tuple(r) for r in read_source(spark, of, info).select("sym", "px").collect())

    log = RequestLog(s3_server.endpoint)
    log.start()
    rows = read(files)
    requests = log.requests()
    assert rows == sorted((r[1], r[2]) for r in BASE + DELTA)
    assert Counter(r.kind for r in requests if r.client == "s3a") == {"HEAD": 2, "GET": 2}, requests
    unsized = [dataclasses.replace(f, size=0) for f in files]
    assert read(unsized) == rows
    # the scan's metadata columns: row positions (a file's deleted rows) and file names
    first_dropped = [dataclasses.replace(f, deleted=DeletedRows(positions_from_selection=pa.array([0], pa.int64())))
                     for f in files]
    assert read(first_dropped) == sorted((r[1], r[2]) for r in BASE[1:] + DELTA[1:])
    named = read_source(spark, files, info, file_name="f").select("f").distinct().collect()
    assert sorted(r.f for r in named) == sorted(posixpath.basename(f.uri) for f in files)

    def other_spark(*_args):  # a Spark whose internal classes differ: Spark lists the files, as before
        raise Py4JError("no such constructor")

    monkeypatch.setattr(spark_read, "_known_files", other_spark)
    log.start()
    assert read(files) == rows
    listed = Counter(r.kind for r in log.requests() if r.client == "s3a")
    assert (listed["HEAD"], listed["LIST"]) == (6, 2), listed  # exists, its index's listing (LIST, HEAD), the task


def _recreate(lake: Lake, name: str, first, second) -> None:
    from laminar_assets import storage

    for uri, _size in storage.list_files(lake.path(name)):
        storage.delete(uri)
    lake.create(name, first)
    lake.append(name, second)


@pytest.mark.parametrize("age,per_file", [(4, 1), (40, 1), (4, 8)])
def test_a_batched_run_costs_requests_in_proportion_to_its_change_not_to_the_sources_age(spark, s3_server, s3_lake,
                                                                                          age, per_file):
    """A batched incremental run over N partitions after a change of one commit per partition, on a source `age`
    commits past its last checkpoint (deltalake checkpoints every 100), in a process that ran the flow before
    (issue #62): the source's snapshot is the last run's plus the files its new commits appended, each commit read
    once (the handle is not moved over them), the NOOP check's listing of its log is not made again, the state
    and sink tables' handles are moved over the last run's commits, their app transactions of all partitions come
    from one read of the commits since except the run's own commit (known), the commits clean the log up only
    with a checkpoint, and the sweep reads nothing the run read; Spark's file index comes from the log (a HEAD and
    a GET per file read). The same count at every age: 52 (gather 6, intents 5, watermark 1, sweep 1, pass 32); 58 while Spark
    read the state files (a HEAD each more), 68 while
    each partition's watermark was its own object (intents 10, watermarks 6), 69 while the sink's commit listed its
    log again after the owner check. With `partitions_per_file` = 8 the run writes one state and one sink file for
    the 6 adjacent partitions and reads one state file: 31 (pass 17). 82 while each
    partition had a lease object (a PUT
    and a DELETE, 12) and the watermarks were listed again under them; 90 while the commits went through deltalake
    (five requests each instead of one PUT), 93 while the sweep of clean commits took its lease; 110 while
    deltalake moved the source's handle and the commits listed the log for its clean-up (gather 19, intents 11,
    pass 50), 146 while Spark listed the files it read (pass 86), and before the log cuts 253 at age 4 and 325 at
    age 40 (gather 46 and 118, intents 32, sweep 17)."""
    n = 6
    parts = [f"2024-01-01-{h:02d}:00" for h in range(n)]
    s3_lake.create("trades", [(f"2024-01-01 {h:02d}:01:00", "a", 1.0, 1) for h in range(n)])
    for i in range(age - 1):  # the table's age: commits to one partition
        s3_lake.append("trades", [(f"2024-01-01 00:{10 + i % 40:02d}:00", "b", 1.0, 1)])
    engine = Engine(spark, s3_lake.root, options=EngineOptions(partitions_per_file=per_file))
    engine.run_many(FLOW, parts)  # every partition refills, the state and sink tables are created
    for minute in (7, 8):  # Δ: one commit per partition, twice; the second run's requests are counted
        for h in range(n):
            s3_lake.append("trades", [(f"2024-01-01 {h:02d}:{minute:02d}:00", "c", 2.0, 1)])
        log = RequestLog(s3_server.endpoint, sinks=(FLOW.name,))
        log.start()
        with phases(log):
            results = engine.run_many(FLOW, parts)
        requests = log.requests()
        assert [r.reason for r in results] == [Reason.APPEND_ONLY] * n
    by_phase = {p: sum(c.values()) for p, c in table(requests, "phase").items()}
    # the source: one read of each new commit (the listing from the watermarks' version is the NOOP check's, in
    # `other`); no file looked for, and deltalake does not move the handle over appends (a listing, two reads each)
    assert _by([r for r in requests if r.phase == "gather"]) == {"GET": n}, by_phase
    # the state table's handle moved over the last run's commit: a listing, no read (the handle is the run's replay
    # of the table's log, `log_snapshot`, which applies the commit it made; deltalake's move listed the log once
    # more and read the commit twice), its app transactions replayed with it; the intents, one write of their block
    assert by_phase["intent"] == 1 + 1, by_phase
    # each commit: one PUT of its log entry (`write_commit`; deltalake made five: a listing, its PUT, and after it
    # a listing and two reads of the new commit); no listing of the whole log for its clean-up, no read of the
    # run's own commit. deltalake commits the one after which a checkpoint is due (none in these two runs)
    for log_of in ("state log", "sink log"):
        assert not _by([r for r in requests if r.phase == "pass" and r.client == "deltalake"], obj=log_of), log_of
        # the sink's commit starts from the handle the check that the sink is the flow's checked out (it listed
        # the log from its version once more: one LIST)
        assert _by([r for r in requests if r.phase == "pass" and r.client == "boto3"], obj=log_of) == {"PUT": 1}
    # no lease, no read: its progress moves with one conditional write (the new commits' statistics prove every
    # event time present and in bounds); 4 when it took its lease, read its progress under it and wrote it
    assert by_phase["sweep"] == 1, by_phase
    # no lease objects, no second listing of the watermarks: the intents claim, the watermarks free (one write of
    # their block each: a week of hourly partitions is one object)
    assert "lease" not in by_phase and "settle" not in by_phase and by_phase["watermark"] == 1, by_phase
    # Spark's reads of 6 source files: the task's HEAD and GET each, nothing before (`scan_files`); the driver's of
    # the 6 state files, or of the one of the 6 adjacent partitions (the last run wrote one for them all): a GET
    # each, their sizes from the log (`EngineOptions.driver_read_below_bytes`)
    state_files = n if per_file == 1 else 1
    assert _by([r for r in requests if r.client == "s3a"]) == {"HEAD": n, "GET": n}, by_phase
    assert _by([r for r in requests if r.object == "state files" and r.kind == "GET"]) == {"GET": state_files}
    # the driver's PUTs of a state and a sink file for each partition, or for the adjacent partitions
    written = [r for r in requests if r.object in ("state files", "sink files") and r.kind != "GET"]
    assert _by(written) == {"PUT": 2 * state_files}, by_phase
    assert len(requests) == (BUDGET if per_file == 1 else BUDGET_SHARED_FILES), (len(requests), str(by_phase))
    sink = Lake(s3_lake.root).read(FLOW.name)
    assert sink["count"].sum() == n + (age - 1) + 2 * n


# The whole run over 6 partitions, exactly (other 3, gather 6, sweep 1, intents 2, pass 32, watermark 1, outcome 1):
# 12 of them are Spark's reads of 6 source files through s3a (a HEAD and
# a GET each; 60 when Spark listed the files itself, and 146 in all), 6 the driver's reads of the state files, 12
# the driver's PUTs of uncommitted files, 2 the writes of the partitions' watermarks block: the intents, then the
# watermarks (docs/PERFORMANCE.md, "Requests per run on S3"). More is a regression; fewer, a cut to record here.
# 52 before the state and sink tables' handles were Laminar's replays of their logs (`log_snapshot`: moved over the
# run's own commit without reading it back; deltalake's move listed the log and read the commit twice, 4 requests
# each, now a listing). 58 before the driver read the small state (Spark's HEAD per state file). 68 before the
# watermarks of a day (a week now) were one object (12 writes: an intent and a watermark per partition). 69 before
# the sink's commit started from the handle the owner check checked out (a listing of its log). 82 before a
# partition's watermark was its lease (its intent claims it, its watermark frees it: no lease object to PUT and
# DELETE, no listing after taking them); 90
# before the commits were one PUT of their log entry instead of deltalake's five requests
# (`output.commit.write_commit`); 93 before the sweep of commits whose statistics prove no row to record moved its
# progress with one conditional write instead of under its lease (4 requests); 110 before the source's appends
# were read once and the commits' clean-up listing and read-back of their own app transactions were cut.
BUDGET = 46
# The same with `EngineOptions.partitions_per_file` = 8: one state and one sink file for the 6 adjacent partitions
# (Spark's reads 12, the driver's read of the state file 1, uncommitted files 2).
BUDGET_SHARED_FILES = 31
