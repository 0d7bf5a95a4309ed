"""A Dagster executor that runs a run's ready steps side by side, in threads of the run's process.

Dagster ships an in-process executor (one step at a time) and a multiprocess one (a Python process
per step, each of which would start its own Spark client and re-import the definitions). Laminar's
steps spend most of their time waiting on Spark, which runs jobs from several threads of one
session concurrently, so the steps whose dependencies are done share the run's resources (one
Spark session, one engine root) and run in threads: the flows of a run after their shared stage,
and the checks after their assets.

Dagster has no public API for an executor's step loop; this follows its in-process executor
(`dagster._core.executor.in_process`) and uses the same internals. The step loop stays in the run's
main thread: it picks ready steps, hands each to a worker thread, and applies every event the
workers produce to the plan's `ActiveExecution` in order, so skips, blocking checks and failures
behave as in the in-process executor. Step events are written to the instance by the worker that
produced them, as they would be in-process."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import partial
from typing import cast

import dagster as dg
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.compute_logs import create_compute_log_file_key
from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import dagster_event_sequence_for_step
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.executor.base import Executor

from laminar_assets.orchestration.internals.pool_wait import SLEEP_SECONDS, PoolWaiter
from laminar_assets.orchestration.internals.run_processes import RunProcess, free_slots

MAX_DEFAULT_THREADS = 4
# An op tag: the step does no Spark work (an export waiting on its target, at its rate limit), so it runs beside
# the `max_concurrent` steps that do, in a lane of its own as wide, instead of holding one of their threads while
# it waits: in the demo a webhook export at 500 rows/s held one of two threads for 3.6 s while four flows queued
# for the other (docs/PERFORMANCE.md, "The demo").
WITHOUT_SPARK_TAG = "laminar/without_spark"
POLL_SECONDS = 0.25  # how often the loop looks for interrupts and ready steps while steps run
_DONE = object()


class _Raised:
    """An error a worker's step raised past Dagster's own handling (DagsterEvent is a tuple, so this is not)."""

    def __init__(self, error: BaseException):
        self.error = error


def default_threads() -> int:
    """Steps at once: one per core, at most MAX_DEFAULT_THREADS. The steps share one driver and one
    Spark JVM, so more threads than cores only trade places (the demo on 2 cores: 4 threads were
    no faster than 2)."""
    return max(1, min(MAX_DEFAULT_THREADS, os.cpu_count() or 1))


def uses_spark(step) -> bool:
    """Whether a step counts against `max_concurrent` (every step but those tagged `WITHOUT_SPARK_TAG`)."""
    return (step.tags or {}).get(WITHOUT_SPARK_TAG) != "true"


class ThreadExecutor(Executor):
    """Runs ready steps in up to `max_concurrent` threads of the run worker's process, and the steps that
    do no Spark work (`WITHOUT_SPARK_TAG`) in up to as many more."""

    def __init__(self, *, max_concurrent: int, retries: RetryMode):
        if max_concurrent < 1:
            raise dg.DagsterInvalidConfigError(
                f"thread executor: max_concurrent must be at least 1, got {max_concurrent}", [], None)
        self.max_concurrent = max_concurrent
        self._retries = retries

    @property
    def retries(self) -> RetryMode:
        return self._retries

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        keys = execution_plan.step_keys_to_execute
        process = RunProcess.current()
        if RunProcess.of_run(plan_context.dagster_run) != process:  # a launched run: say which process has it
            plan_context.instance.add_run_tags(plan_context.run_id, process.tag())
        yield DagsterEvent.engine_event(
            plan_context, f"Executing steps in up to {self.max_concurrent} threads (pid: {os.getpid()})",
            event_specific_data=EngineEventData.in_process(os.getpid(), keys))
        yield from ExecuteRunWithPlanIterable(
            execution_plan=plan_context.execution_plan,
            iterator=partial(_threaded_plan_iterator, max_concurrent=self.max_concurrent),
            execution_context_manager=PlanExecutionContextManager(
                job=plan_context.job,
                retry_mode=plan_context.retry_mode,
                execution_plan=plan_context.execution_plan,
                run_config=plan_context.run_config,
                dagster_run=plan_context.dagster_run,
                instance=plan_context.instance,
                raise_on_error=plan_context.raise_on_error,
                output_capture=plan_context.output_capture,
            ),
        )


@dg.executor(
    name="laminar_threads",
    config_schema={
        "max_concurrent": dg.Field(int, is_required=False,
                                   description="Steps at once (default: one per core, at most 4)."),
        "retries": get_retries_config(),
    },
)
def thread_executor(init_context: dg.InitExecutorContext) -> ThreadExecutor:
    """Runs the steps whose dependencies are done side by side, in threads of the run's process,
    sharing the run's resources (one Spark session)."""
    config = init_context.executor_config  # validated against config_schema: the types below
    max_concurrent = config.get("max_concurrent")
    retries = RetryMode.from_config(cast(Mapping[str, Mapping], config["retries"]))
    assert retries is not None  # a selector's value names exactly one mode (default: enabled)
    return ThreadExecutor(max_concurrent=cast(int | None, max_concurrent) or default_threads(), retries=retries)


def _run_step(step_context, events: queue.Queue) -> None:
    """A worker: the step's events, then _DONE; an error Dagster did not turn into an event goes to the
    loop, which re-raises it in the run's thread."""
    key = step_context.step.key
    try:
        for event in dagster_event_sequence_for_step(step_context):
            events.put((key, event))
    except BaseException as error:  # noqa: BLE001  (re-raised by the loop: nothing is swallowed here)
        events.put((key, _Raised(error)))
    events.put((key, _DONE))


@contextmanager
def _children_deaf_to_ctrl_c(capture: AbstractContextManager) -> Iterator:
    """Enter Dagster's log capture with SIGINT blocked in this thread, so the helper processes it starts (a
    `tail` per stream mirroring the captured file to the terminal, and a Python `watch_orphans` script minding
    each tail) inherit SIGINT blocked. They are in the terminal's process group: on Ctrl-C each watcher died
    with a KeyboardInterrupt traceback (two per run) and the tails stopped mirroring. Now they keep going until
    the capture ends and stops them (SIGTERM), as after a run that was not interrupted; if this process is
    killed, the watchers still end the tails. This process misses nothing: a SIGINT arriving while blocked
    is handled by another thread, or here once the block is lifted, microseconds later."""
    with ExitStack() as stack:
        blocking = hasattr(signal, "pthread_sigmask")  # not on Windows, where Dagster starts no tail
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocking else None
        try:
            value = stack.enter_context(capture)
        finally:
            if before is not None:  # blocking: the mask to restore
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
        yield value


def _threaded_plan_iterator(job_context: PlanExecutionContext, execution_plan: ExecutionPlan, *,
                            max_concurrent: int) -> Iterator[DagsterEvent]:
    compute_logs = job_context.instance.compute_log_manager
    step_keys = [step.key for step in execution_plan.get_steps_to_execute_in_topo_order()]
    with InstanceConcurrencyContext(job_context.instance, job_context.dagster_run) as concurrency, \
            execution_plan.start(retry_mode=job_context.retry_mode, instance_concurrency_context=concurrency,
                                 step_dependency_config=job_context.step_dependency_config) as active:
        log_key = compute_logs.build_log_key_for_run(job_context.run_id, create_compute_log_file_key())
        with _children_deaf_to_ctrl_c(compute_logs.capture_logs(log_key)) as log_context:
            yield DagsterEvent.capture_logs(job_context, step_keys, log_key, log_context)
            events: queue.Queue = queue.Queue()
            running: dict[str, tuple] = {}  # step key -> (step context, its events so far)
            waiting: dict[str, object] = {}  # a retry Dagster re-queued before its last attempt's worker ended
            # steps Dagster handed over for a free thread of the other lane while their own lane was full: they
            # start first when a thread of theirs frees, the highest priority first (Dagster's order)
            held: list = []
            stopping = False
            waiter = PoolWaiter(job_context.instance, job_context.run_id, job_context.log.info)
            pool = ThreadPoolExecutor(max_workers=2 * max_concurrent, thread_name_prefix="laminar-step")  # both lanes

            def launch(step) -> None:
                context = job_context.for_step(step, active.get_known_state())
                running[step.key] = (context, [])
                pool.submit(_run_step, context, events)

            try:
                while running or not (stopping or active.is_complete):
                    if not stopping and active.check_for_interrupts():
                        # A termination request: nothing new starts; a running step cannot be stopped
                        # from outside its thread, so the run ends when the running ones have.
                        stopping = True
                        active.mark_interrupted()
                        yield DagsterEvent.engine_event(
                            job_context, f"Termination requested: no new steps start; waiting for {sorted(running)}",
                            EngineEventData.interrupted(sorted(running)))
                    if not stopping:
                        busy = [uses_spark(c.step) for c, _ in running.values()] + \
                            [uses_spark(s) for s in waiting.values()]
                        free = {True: max_concurrent - sum(busy), False: max_concurrent - busy.count(False)}
                        held.sort(key=_priority, reverse=True)
                        for step in list(held):
                            if free[uses_spark(step)] > 0:
                                held.remove(step)
                                launch(step)
                            free[uses_spark(step)] -= 1  # a held step keeps its lane's next thread
                        for step in active.get_steps_to_execute(limit=max(free[True], 0) + max(free[False], 0)):
                            if step.key in running:
                                waiting[step.key] = step
                            elif free[uses_spark(step)] > 0:
                                free[uses_spark(step)] -= 1
                                launch(step)
                            else:
                                held.append(step)
                        yield from active.concurrency_event_iterator(job_context)
                        # steps waiting for a pool slot: frees a dead holder's, says who holds it, may give up
                        waiter.check(_pool_of(active.get_step_by_key(key))
                                     for key in concurrency.pending_claim_steps())
                    if not running:
                        if concurrency.has_pending_claims():
                            time.sleep(SLEEP_SECONDS)  # Dagster's sleep_til_ready would not sleep at all
                        else:
                            # a step waiting out its retry delay (10-30 s): woken every POLL_SECONDS, so a
                            # termination request ends the run now, not when the delay is over (Dagster's
                            # sleep_til_ready sleeps the whole delay)
                            time.sleep(max(0.0, min(active.sleep_interval(), POLL_SECONDS)))
                        continue
                    try:  # a timeout, so interrupts, delayed retries and freed pool slots are seen
                        key, item = events.get(timeout=POLL_SECONDS)
                    except queue.Empty:
                        continue
                    context, seen = running[key]
                    if isinstance(item, _Raised):
                        raise item.error
                    if item is not _DONE:
                        seen.append(item)
                        yield item
                        active.handle_event(item)
                        continue
                    del running[key]
                    if key not in waiting:  # a re-queued retry is in flight again: this attempt ended known
                        active.verify_complete(job_context, key)
                    for event in active.plan_events_iterator(job_context):  # skips after failures
                        seen.append(event)
                        yield event
                    yield from _hooks(context, seen)
                    if key in waiting and not stopping:
                        launch(waiting.pop(key))
            finally:
                # When the loop stops early (a framework error) nothing new starts, and the run ends after
                # the steps still running: a thread cannot be stopped from outside, and a run that
                # reported its end while a step still wrote would mislead whoever retries it.
                pool.shutdown(wait=True, cancel_futures=True)
                # every step has ended: a slot still claimed is one whose step's end the loop did not
                # see (it stopped early), and nothing of this run can use it any more
                free_slots(job_context.instance, job_context.run_id)


def _priority(step) -> int:
    try:
        return int((step.tags or {}).get("dagster/priority", 0))
    except ValueError:
        return 0


def _pool_of(step) -> str:
    from dagster._core.execution.plan.active import _pool_key_for_step

    return _pool_key_for_step(step) or ""


def _hooks(step_context, step_events) -> Iterator[DagsterEvent]:
    from dagster._core.execution.plan.execute_plan import _trigger_hook

    yield from _trigger_hook(step_context, step_events)
