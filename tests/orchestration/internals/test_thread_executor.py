"""The thread executor on a real (temporary) Dagster instance: independent steps overlap, dependencies,
failures, skips and blocking checks behave as in Dagster's in-process executor."""

import signal
import threading
import time

import dagster as dg
import pytest

from laminar_assets.orchestration.internals.in_process import execute_job_here
from laminar_assets.orchestration.internals.thread_executor import (
    WITHOUT_SPARK_TAG,
    ThreadExecutor,
    default_threads,
    thread_executor,
)

pytestmark = pytest.mark.process

BARRIER_SECONDS = 20


def _run(assets, *, checks=(), max_concurrent=None, tags=None, executor=None):
    if executor is None:
        executor = thread_executor.configured({"max_concurrent": max_concurrent}) if max_concurrent else thread_executor
    job = dg.Definitions(jobs=[dg.define_asset_job("j", executor_def=executor)], assets=assets,
                         asset_checks=list(checks)).resolve_job_def("j")
    with dg.instance_for_test() as instance:
        result = execute_job_here(job, instance=instance, partition_key=None, tags=tags or {}, run_config={})
        events = [(e.event_type_value, e.step_key) for e in result.all_events]
        record = instance.get_run_by_id(result.run_id)
        logs = [e.message for e in instance.all_logs(result.run_id)]
    return result, events, record, logs


def _order(events, kind):
    return [key for k, key in events if k == kind]


def _step_outcomes(events):
    """What happened to each step, as Dagster's own in-process executor would report it."""
    return sorted((k, key) for k, key in events if key and k.startswith("STEP_") or k.endswith("_EVALUATION"))


def _same_as_in_process(assets, checks=()):
    threaded, t_events, *_ = _run(assets, checks=checks, max_concurrent=3)
    serial, s_events, *_ = _run(assets, checks=checks, executor=dg.in_process_executor)
    assert threaded.success == serial.success
    assert _step_outcomes(t_events) == _step_outcomes(s_events)
    return t_events


def test_independent_steps_run_at_the_same_time():
    # Both branches wait for each other: with one step at a time the barrier would break.
    meet = threading.Barrier(2, timeout=BARRIER_SECONDS)

    @dg.asset
    def root():
        return dg.MaterializeResult()

    @dg.asset(deps=[root])
    def left():
        meet.wait()
        return dg.MaterializeResult()

    @dg.asset(deps=[root])
    def right():
        meet.wait()
        return dg.MaterializeResult()

    result, events, record, logs = _run([root, left, right], max_concurrent=2)
    assert result.success and record.status == dg.DagsterRunStatus.SUCCESS
    starts = _order(events, "STEP_START")
    assert starts[0] == "root" and set(starts[1:]) == {"left", "right"}
    # the downstream steps start only after the upstream step succeeded
    assert events.index(("STEP_SUCCESS", "root")) < events.index(("STEP_START", "left"))
    assert any("up to 2 threads" in (m or "") for m in logs)


def test_max_concurrent_bounds_the_steps_in_flight():
    lock, state = threading.Lock(), {"now": 0, "most": 0, "peers": 1}

    def work():
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.3)
        # with room for more, a step waits (bounded) for a peer: a loaded machine that starts the
        # next step late does not make the run look serial
        deadline = time.monotonic() + 20
        while state["most"] < state["peers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:
            state["now"] -= 1

    assets = []
    for name in ("a", "b", "c", "d"):
        @dg.asset(name=name)
        def _asset():
            work()
            return dg.MaterializeResult()
        assets.append(_asset)

    result, *_ = _run(assets, max_concurrent=1)
    assert result.success and state["most"] == 1
    state.update(most=0, peers=2)
    result, *_ = _run(assets, max_concurrent=3)
    assert result.success and 2 <= state["most"] <= 3


def test_steps_without_spark_run_beside_the_spark_steps_without_taking_their_thread():
    """An export waiting on its target (tagged WITHOUT_SPARK_TAG) runs beside `max_concurrent` Spark steps; the
    Spark steps stay bounded while it runs, and a Spark step Dagster handed over early still starts."""
    lock, state = threading.Lock(), {"spark": 0, "most_spark": 0}
    meet = threading.Barrier(2, timeout=BARRIER_SECONDS)  # an export and a Spark step, at once

    def spark_work():
        with lock:
            state["spark"] += 1
            state["most_spark"] = max(state["most_spark"], state["spark"])
        time.sleep(0.2)
        with lock:
            state["spark"] -= 1

    @dg.asset(op_tags={WITHOUT_SPARK_TAG: "true"}, deps=["flow_a"])
    def export_a():
        meet.wait()  # breaks unless flow_b runs meanwhile, with one thread for Spark steps
        return dg.MaterializeResult()

    @dg.asset(op_tags={WITHOUT_SPARK_TAG: "true"})
    def export_b():
        return dg.MaterializeResult()

    @dg.asset
    def flow_a():
        spark_work()
        return dg.MaterializeResult()

    @dg.asset(deps=["flow_a"])
    def flow_b():
        meet.wait()
        spark_work()
        return dg.MaterializeResult()

    @dg.asset(deps=["flow_a"])
    def flow_c():
        spark_work()
        return dg.MaterializeResult()

    result, events, *_ = _run([export_a, export_b, flow_a, flow_b, flow_c], max_concurrent=1)
    assert result.success, events
    assert state["most_spark"] == 1  # never two Spark steps at once
    assert set(_order(events, "STEP_SUCCESS")) == {"export_a", "export_b", "flow_a", "flow_b", "flow_c"}


def test_a_failed_step_skips_its_dependents_and_not_the_other_branch():
    @dg.asset
    def broken():
        raise dg.Failure(description="broken on purpose")

    @dg.asset(deps=[broken])
    def after_broken():
        return dg.MaterializeResult()

    @dg.asset
    def fine():
        time.sleep(0.2)
        return dg.MaterializeResult()

    result, events, record, _ = _run([broken, after_broken, fine], max_concurrent=2)
    assert not result.success and record.status == dg.DagsterRunStatus.FAILURE
    assert ("STEP_FAILURE", "broken") in events
    assert ("STEP_SUCCESS", "fine") in events
    assert "after_broken" not in _order(events, "STEP_START")
    _same_as_in_process([broken, after_broken, fine])


def test_a_failing_blocking_check_keeps_downstream_assets_from_running():
    @dg.asset
    def upstream():
        return dg.MaterializeResult()

    @dg.asset_check(asset=upstream, blocking=True)
    def must_pass():
        return dg.AssetCheckResult(passed=False)

    @dg.asset(deps=[upstream])
    def downstream():
        return dg.MaterializeResult()

    result, events, _, _ = _run([upstream, downstream], checks=[must_pass], max_concurrent=3)
    assert not result.success
    assert "downstream" not in _order(events, "STEP_START")
    _same_as_in_process([upstream, downstream], [must_pass])


def test_an_error_outside_user_code_fails_the_run_with_its_message(monkeypatch):
    import laminar_assets.orchestration.internals.thread_executor as module

    def explode(step_context):
        raise RuntimeError("executor broke")
        yield  # pragma: no cover - makes this a generator like the real one

    monkeypatch.setattr(module, "dagster_event_sequence_for_step", explode)

    @dg.asset
    def one():
        return dg.MaterializeResult()

    result, events, record, _ = _run([one], max_concurrent=2)
    assert not result.success and record.status == dg.DagsterRunStatus.FAILURE
    failure = next(e for e in result.all_events if e.is_run_failure)
    assert "RuntimeError: executor broke" in failure.event_specific_data.error.message


def test_a_step_retried_at_once_runs_again_after_its_first_attempt():
    # Dagster re-queues a retry without delay at once, while the first attempt's worker is still ending.
    calls = []

    @dg.asset
    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise dg.RetryRequested(max_retries=2)
        return dg.MaterializeResult()

    @dg.asset
    def slow():
        time.sleep(0.5)
        return dg.MaterializeResult()

    result, events, record, _ = _run([flaky, slow], max_concurrent=3)
    assert result.success and record.status == dg.DagsterRunStatus.SUCCESS, events
    assert ("STEP_UP_FOR_RETRY", "flaky") in events and ("STEP_SUCCESS", "flaky") in events
    assert len(calls) == 2


def test_a_termination_request_starts_no_new_step(tmp_path):
    import os
    import signal

    @dg.asset
    def first():
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        time.sleep(1.5)
        return dg.MaterializeResult()

    @dg.asset(deps=[first])
    def second():
        (tmp_path / "second-ran").write_text("yes")
        return dg.MaterializeResult()

    job = dg.Definitions(jobs=[dg.define_asset_job("j", executor_def=thread_executor.configured({"max_concurrent": 2}))],
                         assets=[first, second]).resolve_job_def("j")
    with dg.instance_for_test() as instance:
        # the process was asked to stop: the caller (`laminar demo`, `refill`) stops too, as interrupted,
        # instead of going on to its next run with the interrupted one's partitions held
        with pytest.raises(KeyboardInterrupt, match="was interrupted"):
            execute_job_here(job, instance=instance, partition_key=None, tags={}, run_config={})
        [record] = instance.get_runs()
        events = [(e.dagster_event.event_type_value, e.dagster_event.step_key)
                  for e in instance.all_logs(record.run_id) if e.dagster_event]
    assert record.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    assert "second" not in _order(events, "STEP_START") and not (tmp_path / "second-ran").exists()
    # the running step was not cut off: it ended, and its end is recorded
    assert ("STEP_SUCCESS", "first") in events


def test_a_termination_request_ends_a_run_whose_step_waits_for_its_retry():
    """Nothing runs while a step waits out its retry delay: a stop ends the run then, not after the delay."""
    import os

    @dg.asset
    def flaky():
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        raise dg.RetryRequested(max_retries=1, seconds_to_wait=120)

    job = dg.Definitions(jobs=[dg.define_asset_job("j", executor_def=thread_executor)],
                         assets=[flaky]).resolve_job_def("j")
    with dg.instance_for_test() as instance:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match="was interrupted"):
            execute_job_here(job, instance=instance, partition_key=None, tags={}, run_config={})
        waited = time.monotonic() - started
        [record] = instance.get_runs()
        events = [e.dagster_event.event_type_value for e in instance.all_logs(record.run_id) if e.dagster_event]
    assert waited < 60, f"the run waited {waited:.0f} s of the step's 120-s retry delay after the stop"
    assert record.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    assert events.count("STEP_START") == 1 and "STEP_UP_FOR_RETRY" in events


def test_bad_settings_are_refused():
    with pytest.raises(dg.DagsterInvalidConfigError, match="max_concurrent must be at least 1, got 0"):
        ThreadExecutor(max_concurrent=0, retries=None)
    assert 1 <= default_threads() <= 4


def test_the_definitions_use_it():
    from laminar_assets.definitions import defs

    assert defs.executor is thread_executor


def test_dagster_log_capture_helpers_do_not_hear_ctrl_c():
    """Dagster's log capture starts a `tail` per stream and a Python script minding each, in the terminal's
    process group: on Ctrl-C of `laminar demo` the two scripts died with KeyboardInterrupt tracebacks. They
    are started with SIGINT blocked now (the kernel's record of each process says so; no signal is sent)."""
    import psutil

    blocked = {}

    @dg.asset
    def step():
        for child in psutil.Process().children():
            command = " ".join(child.cmdline()[:2])
            if "watch_orphans" not in command and not command.startswith("tail"):
                continue  # a server another test of this process started (a JVM, moto, Redis)
            with open(f"/proc/{child.pid}/status") as status:
                mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
            blocked[command] = bool(mask & (1 << (signal.SIGINT - 1)))
        return dg.MaterializeResult()

    result, *_ = _run([step])
    assert result.success
    assert any("watch_orphans" in cmd for cmd in blocked) and any(cmd.startswith("tail") for cmd in blocked), blocked
    assert all(blocked.values()), blocked


def test_success_and_failure_hooks_fire_as_in_process():
    """The executor fires a step's hooks through Dagster's private `_trigger_hook`: a Dagster release that moves or
    changes it fails here, instead of hooks (a team's Slack alert on a failed step) silently never firing."""
    fired: list[tuple[str, str]] = []

    @dg.success_hook
    def on_success(context):
        fired.append(("success", context.step_key))

    @dg.failure_hook
    def on_failure(context):
        fired.append(("failure", context.step_key))

    @dg.asset
    def fine():
        return dg.MaterializeResult()

    @dg.asset
    def broken():
        raise ValueError("boom")

    outcomes = {}
    for name, executor in (("threads", thread_executor), ("in_process", dg.in_process_executor)):
        fired.clear()
        job = dg.Definitions(jobs=[dg.define_asset_job("j", executor_def=executor, hooks={on_success, on_failure})],
                             assets=[fine, broken]).resolve_job_def("j")
        with dg.instance_for_test() as instance:
            result = execute_job_here(job, instance=instance, partition_key=None, tags={}, run_config={})
            hook_events = sorted(e.step_key for e in result.all_events if e.event_type_value == "HOOK_COMPLETED")
        outcomes[name] = (sorted(fired), hook_events)
    assert outcomes["threads"] == outcomes["in_process"]
    assert outcomes["threads"][0] == [("failure", "broken"), ("success", "fine")]
