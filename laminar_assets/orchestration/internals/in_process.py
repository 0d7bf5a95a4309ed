"""Running Dagster run requests in this process: what the sensor daemon would launch,
executed with `materialize` on a real instance (used by the CLI, the demo and tests)."""

from collections.abc import Callable

import dagster as dg

from laminar_assets.orchestration.internals.pool_wait import PoolWaitPolicy, pool_wait_policy
from laminar_assets.orchestration.internals.run_processes import RunProcess, fail_dead_runs
from laminar_assets.orchestration.internals.thread_executor import thread_executor

# Dagster logs step and run failures (with their stack traces) at ERROR and never logs at CRITICAL, so
# this silences its console echo entirely; events still go to the instance (and the UI), and callers
# report a failure in one line with `failure_message`.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
RUN_JOB = "__laminar_request_run"
POOL_WAIT_SECONDS = 600.0
"""How long a run executed here waits for a concurrency slot another live run holds, by default."""
IN_PROCESS_POOL_WAIT = PoolWaitPolicy(seconds=POOL_WAIT_SECONDS)


def execute_request(defs: dg.Definitions, request: dg.RunRequest, instance: dg.DagsterInstance, *,
                    pool_wait_seconds: float | None = POOL_WAIT_SECONDS,
                    notify: Callable[[str], None] | None = None) -> dg.ExecuteInProcessResult:
    """Materialize what one run request asks for: one partition, or a partition range in one run.
    The assets come from `defs` with their resources bound. While another run holds a concurrency
    slot the run needs, `notify` hears which run; after `pool_wait_seconds` the run fails. `notify` also
    hears of runs failed because their process was gone (run_processes.py)."""
    from laminar_assets.orchestration.sensors import RANGE_END, RANGE_START  # (the engine: not for execute_job_here)

    graph = defs.resolve_asset_graph()
    # Every definition goes in (resources bound), the request's assets and checks are selected: the
    # checks run in the same run, as they do when the daemon launches the request.
    assets = list(graph.assets_defs)
    assert request.asset_selection is not None, request  # Laminar's sensors name the assets of every request
    checks = request.asset_check_keys
    if checks is None:
        checks = [c for c in graph.asset_check_keys if c.asset_key in set(request.asset_selection)]
    selection = dg.AssetSelection.assets(*request.asset_selection).without_checks() | \
        dg.AssetSelection.checks(*checks)
    tags = dict(request.tags)
    if request.partition_key is None and (RANGE_START not in tags or RANGE_END not in tags):
        raise ValueError(f"run request {request.run_key} names neither a partition nor a range")
    executor = defs.executor or thread_executor
    assert isinstance(executor, dg.ExecutorDefinition), executor  # builder.py: an ExecutorDefinition, never an Executor
    job = dg.Definitions(jobs=[dg.define_asset_job(RUN_JOB, selection=selection, executor_def=executor)],
                         assets=assets).resolve_job_def(RUN_JOB)
    return execute_job_here(job, instance=instance, partition_key=request.partition_key, tags=tags,
                            run_config=QUIET_CONSOLE,
                            pool_wait=PoolWaitPolicy(seconds=pool_wait_seconds, notify=notify))


def execute_job_here(job: dg.JobDefinition, *, instance: dg.DagsterInstance, partition_key: str | None,
                     tags: dict, run_config: dict,
                     pool_wait: PoolWaitPolicy = IN_PROCESS_POOL_WAIT) -> dg.ExecuteInProcessResult:
    """`job.execute_in_process`, but with the job's own executor (Laminar's thread executor runs the
    run's independent steps side by side): `execute_in_process` always swaps in the one-step-at-a-time
    executor. The run is recorded on `instance` like any other; step failures are in its events.

    The run names this process in its tags from the start, so that if this process is killed, the
    next run to meet it fails it and frees its pool slots; and before it starts, runs of the instance
    left unfinished by a process that is gone are failed (run_processes.py)."""
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.execution.execute_in_process import core_execute_in_process, merge_run_tags

    for note in fail_dead_runs(instance):
        if pool_wait.notify is not None:
            pool_wait.notify(note)
    tags = {**tags, **RunProcess.current().tag()}
    with pool_wait_policy(pool_wait):
        outcome = core_execute_in_process(
            run_config=run_config, job=InMemoryJob(job), instance=instance, output_capturing_enabled=False,
            raise_on_error=False,
            run_tags=merge_run_tags(job_def=job, partition_key=partition_key, tags=tags, asset_selection=None,
                                    instance=instance, run_config=run_config))
    if was_interrupted(outcome):
        # Dagster took the Ctrl-C (SIGINT) as a request to end the run: its running steps finished, no
        # new one started, the run is recorded failed. The user asked the process to stop, so it stops
        # here as interrupted (the CLI exits 130) instead of going on to its next run (`laminar demo`).
        raise KeyboardInterrupt(f"run {outcome.run_id} was interrupted")
    return outcome


def was_interrupted(outcome: dg.ExecuteInProcessResult) -> bool:
    """Whether an interrupt ended the run: the thread executor's termination event, or the error an
    executor that raises interrupts (Dagster's own) fails the run with."""
    for event in outcome.all_events:
        data = event.event_specific_data
        if event.event_type_value == "ENGINE_EVENT" and "steps_interrupted" in (getattr(data, "metadata", None) or {}):
            return True
        if event.is_run_failure or event.is_step_failure:
            error = getattr(data, "error", None)
            while error is not None:
                if error.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
                    return True
                error = error.cause
    return False


def failure_message(outcome: dg.ExecuteInProcessResult) -> str:
    """Why a run failed, in one line, from its events: the first failed step's `dagster.Failure` description
    (the assets put a LaminarError's message there), else the innermost exception's first line."""
    failure = next((e for e in outcome.all_events if e.is_step_failure), None)
    if failure is None:
        run_failure = next((e for e in outcome.all_events if e.is_run_failure), None)
        error = run_failure.job_failure_data.error if run_failure is not None else None
        if error is not None:  # raised outside any step (e.g. giving up on a pool slot): the innermost error
            while error.cause is not None:
                error = error.cause
            return _first_line(_without_laminar_class(error.message, error.cls_name))
        return _first_line(run_failure.message if run_failure and run_failure.message else "the run failed")
    data = failure.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return _first_line(data.user_failure_data.description)
    error = data.error
    while error is not None and error.cause is not None:  # Dagster wraps user exceptions in its own
        error = error.cause
    return _first_line(error.message) if error is not None else f"step {failure.step_key} failed"


def _without_laminar_class(message: str, cls_name: str | None) -> str:
    """A LaminarError's message without the `laminar_assets.errors.ConcurrentRunError: ` in front of it."""
    head, sep, rest = message.partition(": ")
    return rest if sep and cls_name and head.startswith("laminar_assets.") and head.endswith(cls_name) else message


def _first_line(text: str) -> str:
    """The first non-blank line of a message, stripped."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()


def evaluate_sensor(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, cursor: str | None,
                    resources: dict | None = None):
    """One tick of a sensor, as the daemon evaluates it, except that a Laminar pipeline sensor that finds
    nothing to do skips at once instead of watching its sources for a while: the caller ticks again when
    it wants to (`sensors.WATCHING`)."""
    from laminar_assets.orchestration.sensors import WATCHING

    sensor = defs.resolve_sensor_def(name)
    token = WATCHING.set(False)
    try:
        with dg.build_sensor_context(instance=instance, cursor=cursor,
                                     resources=resources or dict(defs.resources or {}), definitions=defs) as ctx:
            return sensor(ctx)
    finally:
        WATCHING.reset(token)
