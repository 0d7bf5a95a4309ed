"""`laminar demo` and `laminar check --demo` say what their runs wait for, as `laminar refill` does: their driver
executed each run request with no `notify`, so a run that met a run of a dead process, or waited up to ten minutes
for a slot another run held, did it without a word. On a real instance, with no Spark: a run left STARTED by a
process that is gone is failed and its slots freed when the demo's next run starts, and the demo hears it."""

from __future__ import annotations

import socket
import subprocess

import dagster as dg

from laminar_assets.demo.run import Driver
from laminar_assets.orchestration.internals.run_processes import RunProcess


def test_the_demo_driver_hears_what_its_runs_do_about_other_runs(tmp_path):
    parts = dg.StaticPartitionsDefinition(["a"])

    @dg.asset(partitions_def=parts)
    def counts():
        return dg.MaterializeResult(metadata={"mode": "REFILL", "reason": "NO_WATERMARK"})  # what the demo's table shows

    @dg.sensor(name="trades_pipeline", asset_selection=[counts])
    def trades_pipeline(context):  # one request on its first tick, none after (the driver stops when quiet)
        requests = [] if context.cursor else [dg.RunRequest(asset_selection=[counts.key], partition_key="a")]
        return dg.SensorResult(run_requests=requests, cursor="done")

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no live process now (and a reused one has another start time)
    defs = dg.Definitions(assets=[counts], sensors=[trades_pipeline], resources={})
    heard: list[str] = []
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        left = instance.create_run_for_job(
            dg.Definitions(assets=[counts], jobs=[dg.define_asset_job("j")]).resolve_job_def("j"),
            tags=RunProcess(gone.pid, socket.gethostname(), "0").tag())
        instance.handle_run_event(left.run_id, dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_START.value, job_name=left.job_name))
        assert instance.get_run_by_id(left.run_id).status == dg.DagsterRunStatus.STARTED
        rows, _, requested = Driver(defs, instance, ["trades_pipeline"], notify=heard.append).until_quiet()
        assert requested == 1 and [r.success for r in rows] == [True]
        assert instance.get_run_by_id(left.run_id).status == dg.DagsterRunStatus.FAILURE
    assert any(n.startswith(f"run {left.run_id} was left STARTED by a process that is gone (pid {gone.pid} on ")
               for n in heard), heard
