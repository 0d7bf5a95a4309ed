"""docs/dagster.md's table of materialization metadata stays in step with what a run's materialization
carries (`orchestration.assets.run_metadata`, its metrics from `RunMetrics.shown`): a metric added to
`RunMetrics.shown` without a row in the table fails here."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from laminar_assets.engine import Mode, PartitionPlan, Reason, RunMetrics, RunResult, SweepResult
from laminar_assets.engine.windows import Interval
from laminar_assets.orchestration.assets import run_metadata

DOC = Path(__file__).resolve().parents[2] / "docs" / "dagster.md"


def _documented() -> set[str]:
    text = DOC.read_text()
    table = text[text.index("## Materialization metadata"):]
    table = table[:table.index("\n\n", table.index("| key | meaning |"))]
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z_<>]+)`", row.split(" | ")[0])}


def test_every_key_a_materialization_carries_is_documented():
    hour = Interval(datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, 1, tzinfo=UTC))
    plan = PartitionPlan(flow="vw", partition="2024-01-01-00:00", interval=hour, needed=hour, mode=Mode.REFILL,
                         reason=Reason.NON_APPEND_ON_NON_RETRACTABLE, detail="", spec_hash="h",
                         from_versions={"trades": 0}, to_versions={"trades": 1}, refill_groups=(1,),
                         group_windows=(Interval(hour.start, hour.start + timedelta(minutes=10)),))
    every = RunMetrics.of({name: 1 for name in RunMetrics.names()})
    result = RunResult(plan, "run-1", every, {"plan": 0.1}, {"positive_px": 1},
                       SweepResult({"no_event_time": 1}, {"trades": "commits 1..1"}))
    produced = {re.sub(r"^source_version_.*", "source_version_<table>", k) for k in run_metadata(result)}
    documented = _documented()
    assert set(RunMetrics.shown) <= produced
    assert produced <= documented, f"in the metadata, not in docs/dagster.md's table: {sorted(produced - documented)}"
