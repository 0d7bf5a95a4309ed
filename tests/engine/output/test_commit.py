"""The commits of a run (`output.commit`): each one entry of the Delta log written by Laminar with a put-if-absent
(`write_commit`), except on a table whose protocol asks more of a writer and for the commit after which a
checkpoint is due, which `deltalake` makes. Readers (deltalake, and Spark through the run) see the same table
either way."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Engine
from laminar_assets.engine.output.commit import CHECKPOINT_EVERY, own_commit_allowed
from tests.engine.test_batched_runs import KEYS, check
from tests.engine.test_crash_safety import EXTREMES


def _engine_of(log: str, version: int) -> str:
    with open(os.path.join(log, f"{version:020d}.json")) as fh:
        return json.loads(fh.readline())["commitInfo"]["engineInfo"]


@pytest.mark.spark
def test_runs_commit_their_own_log_entries_and_deltalake_the_ones_a_checkpoint_follows(spark, lake, tmp_path):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 01:05:00", "b", 7.0, 3)])
    engine = Engine(spark, lake.root)
    engine.run_many(EXTREMES, KEYS)
    for i in range(CHECKPOINT_EVERY + 1):  # the sink's versions pass the first checkpoint (version 9)
        lake.append("trades", [(f"2024-01-01 0{i % 3}:{10 + i:02d}:00", "ab"[i % 2], float(i), 1)])
        if i % 4 == 3:
            lake.delete("trades", f"px = {float(i - 1)}")  # corrections: commits with removes too
        engine.run_many(EXTREMES, KEYS)
        check(spark, lake, EXTREMES)
    sink = DeltaTable(lake.path(EXTREMES.sink))
    log = os.path.join(lake.path(EXTREMES.sink), "_delta_log")
    assert sink.version() > CHECKPOINT_EVERY
    due = CHECKPOINT_EVERY - 1
    assert os.path.exists(os.path.join(log, f"{due:020d}.checkpoint.parquet"))
    assert _engine_of(log, due).startswith("delta-rs")
    assert {_engine_of(log, v) for v in range(1, sink.version() + 1) if v != due} == {"laminar"}
    # the app transactions of the own commits are the table's, through the checkpoint as well
    apps = {k: sink.transaction_version(f"laminar/{EXTREMES.name}/{k}") for k in KEYS}
    assert apps == {k: engine.ctx.store.load(EXTREMES.name, k).seq for k in KEYS}, apps
    fresh = DeltaTable(lake.path(EXTREMES.sink))  # a reader from the checkpoint on
    assert fresh.to_pyarrow_table().num_rows == lake.read(EXTREMES.sink).shape[0]


SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def _table(path, **config) -> DeltaTable:
    write_deltalake(str(path), SCHEMA.empty_table(), configuration=config or None)
    return DeltaTable(str(path))


def test_a_table_asking_more_of_a_writer_is_committed_by_deltalake(tmp_path):
    assert own_commit_allowed(_table(tmp_path / "plain", **{"delta.enableChangeDataFeed": "true"}))
    assert not own_commit_allowed(_table(tmp_path / "append_only", **{"delta.appendOnly": "true"}))
    assert not own_commit_allowed(_table(tmp_path / "dv", **{"delta.enableDeletionVectors": "true"}))
    constrained = _table(tmp_path / "checked")
    constrained.alter.add_constraint({"positive": "v > 0"})
    assert not own_commit_allowed(DeltaTable(str(tmp_path / "checked")))
    # the commit after which a checkpoint is due: deltalake writes the checkpoint from the snapshot it leaves
    due = _table(tmp_path / "due", **{"delta.checkpointInterval": "2"})  # version 0: commit 1 makes one due
    assert not own_commit_allowed(due)
    write_deltalake(str(tmp_path / "due"), SCHEMA.empty_table(), mode="append")
    assert own_commit_allowed(DeltaTable(str(tmp_path / "due")))
