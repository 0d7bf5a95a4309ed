"""The demo's table of a run (`demo.run.run_rows`): a run that failed outside any step says why on every row."""

from __future__ import annotations

from types import SimpleNamespace

import dagster as dg

from laminar_assets.demo.run import run_rows


def _run_failure(message: str):
    error = SimpleNamespace(message=f"NameError: {message}", cls_name="NameError", cause=None)
    return SimpleNamespace(is_step_failure=False, is_run_failure=True, message="Execution of run failed.",
                           job_failure_data=SimpleNamespace(error=error))


def test_a_run_that_failed_outside_any_step_names_the_error_on_each_row():
    """What ExecuteInProcessResult offers `run_rows` (no materialization, no failed step, the run's failure event):
    a run whose executor could not start. Each asset's row is FAILED with the error, not 'skipped: an upstream
    step failed', which sent a user looking for a step that never ran."""
    outcome = SimpleNamespace(success=False, all_events=[_run_failure("name 'X' is not defined")],
                              asset_materializations_for_node=lambda name: [])
    request = dg.RunRequest(asset_selection=[dg.AssetKey("normalized_trades"), dg.AssetKey("vwap_1m")],
                            partition_key="2024-01-01-00:00")
    rows = run_rows(request, outcome)
    assert [(r.flow, r.mode, r.success) for r in rows] == [("normalized_trades", "FAILED", False), ("vwap_1m", "FAILED", False)]
    assert all("name 'X' is not defined" in r.error for r in rows), rows
