"""`laminar_system.partitions` names the failing partitions: a user asked `laminar sql` which partitions fail and
since when, and the table had only `failed_attempt` (why the next run refills), not the failed runs `laminar
status` counts. Its rows are built without Spark, so this needs none."""

from __future__ import annotations

from datetime import datetime

from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.engine import Agg, FlowSpec, Tumbling, record_refused_run
from laminar_assets.engine.report import system_tables as st
from laminar_assets.errors import SourceError

FLOW = FlowSpec(name="counts", source="raw", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),))
GOOD, BAD = "2024-01-01-00:00", "2024-01-01-01:00"


def test_failing_partitions_have_their_failed_runs_since_and_last_error(tmp_path):
    root = str(tmp_path / "lake")
    store = CheckpointStore(root)
    store.save(Watermark("counts", GOOD, FLOW.spec_hash, {"raw": 3}, 1, updated_at="2024-01-02T00:00:00+00:00"))
    for version in (4, 5):  # two runs in a row refused: the source's table is gone
        record_refused_run(store, FLOW, [BAD], f"run-{version}", SourceError(f"source 'raw' is gone (v{version})"))
    names = [f.name for f in st.PARTITIONS_SCHEMA.fields]
    assert names[-3:] == ["failed_runs", "failing_since", "last_error"]
    rows = {r["partition"]: r for r in (dict(zip(names, row)) for row in st.partition_rows(root, [FLOW]))}
    assert (rows[GOOD]["failed_runs"], rows[GOOD]["failing_since"], rows[GOOD]["last_error"]) == (0, None, None)
    bad = rows[BAD]
    failed = store.load("counts", BAD).failed_runs
    assert bad["failed_runs"] == 2 and bad["failing_since"] == datetime.fromisoformat(failed.since)
    assert "source 'raw' is gone (v5)" in bad["last_error"]
