"""A run-failure sensor: every failed run is reported to the alert target in `[tool.laminar] alert`; and a
run-success sensor: a run that ran a failed run's partitions again (orchestration/resume.py) and succeeded is
reported too, so the people its failure alerts told of an outage hear that it is over.

Targets: "log" (the sensor's log, shown on its tick in the UI), a webhook URL (an
HTTP POST of the alert as JSON, e.g. a Slack or Teams incoming webhook), or
"package.module:function", called with the `Alert`. A target that cannot be reached
fails the sensor's tick, so a broken alert path is visible rather than silent.
"""

from __future__ import annotations

import importlib
import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

import dagster as dg

from laminar_assets.errors import LaminarError
from laminar_assets.orchestration import resume
from laminar_assets.orchestration.assets import COMPONENT_TAG, PARTITION_TAG
from laminar_assets.pipeline.settings import LaminarSettings

SENSOR_NAME = "laminar_run_failures"
RECOVERY_SENSOR_NAME = "laminar_run_recoveries"


@dataclass(frozen=True)
class Alert:
    """What a failed run tells the people on call."""

    run_id: str
    job: str
    message: str
    assets: tuple[str, ...]
    partition_range: str | None
    component: str | None
    # when its part's sensor runs its partitions again (orchestration/resume.py), seconds after the alert, and as
    # which attempt; None when it does not (an error a retry does not fix, a run of no part, resume off)
    runs_again_in_seconds: float | None = None
    attempt: int | None = None
    # set on the notice that a run again succeeded: the first failed run of the chain (`message` says the rest)
    recovered_from: str | None = None

    @property
    def text(self) -> str:
        where = f" partitions {self.partition_range}" if self.partition_range else ""
        if self.recovered_from:
            return f"Laminar run {self.run_id} ({', '.join(self.assets) or self.job}{where}) succeeded: {self.message}"
        again = "" if self.runs_again_in_seconds is None else \
            f" (its partitions run again in {self.runs_again_in_seconds:.0f} s, attempt {self.attempt})"
        return f"Laminar run {self.run_id} ({', '.join(self.assets) or self.job}{where}) failed: {self.message}{again}"


def send(target: str, alert: Alert) -> None:
    """Deliver `alert` to `target` ('log' is handled by the sensor itself)."""
    if target.startswith(("http://", "https://")):
        body = json.dumps({"text": alert.text, **asdict(alert)}).encode()
        request = urllib.request.Request(target, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except (urllib.error.URLError, TimeoutError) as exc:
            raise LaminarError(f"could not deliver the alert for run {alert.run_id} to {target}: {exc}; "
                               "check the alert setting ([tool.laminar] alert, or a Laminar component's `alert`)") from exc
        return
    module, _, name = target.partition(":")
    if not module or not name:
        raise LaminarError(f"alert target {target!r} is not 'log', a URL or 'package.module:function'; "
                           "fix the alert setting ([tool.laminar] alert, or a Laminar component's `alert`)")
    try:
        handler = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise LaminarError(f"alert target {target!r} cannot be imported: {exc}; fix the alert setting "
                           "([tool.laminar] alert, or a Laminar component's `alert`)") from exc
    handler(alert)


def _runs_again(instance: dg.DagsterInstance, run: dg.DagsterRun, settings: LaminarSettings) -> dict:
    """When the part's sensor runs the failed run's partitions again: an alert on each failed attempt of a long
    outage then says that no one needs to act yet."""
    if COMPONENT_TAG not in run.tags or not settings.resume_seconds:
        return {}
    records = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]), limit=1)
    if not records:
        return {}
    failed = resume.failed_run(instance, records[0], first=settings.resume_seconds, longest=settings.resume_max_seconds)
    if not failed.retryable:
        return {}
    return {"runs_again_in_seconds": round(max(0.0, failed.due - resume.now()), 1), "attempt": failed.attempt}


def told(attempt: int | None) -> bool:
    """Whether a failed run is told to the alert target: every failure that does not run again, and in a chain of
    runs again (a long outage) the failures before attempts 1, 2, 4, 8, ...: an hour's outage is four alerts instead of
    nine, a day's eight instead of about 140, and the recovery is told in any case."""
    return attempt is None or attempt & (attempt - 1) == 0


def build_failure_sensor(settings: LaminarSettings) -> dg.SensorDefinition:
    target = settings.alert

    @dg.run_failure_sensor(name=SENSOR_NAME, default_status=dg.DefaultSensorStatus.RUNNING,
                           description=f"Reports failed runs to the alert target ({target}): every one, except that "
                                       "of a failed run's partitions run again and again in a long outage, the "
                                       "failures before attempts 1, 2, 4, 8, ... (the recovery is told too).")
    def _report(context: dg.RunFailureSensorContext) -> None:
        # None for every run, told or not: Dagster fails a tick whose runs return both a SkipReason and None (a
        # reaction), and a failed tick keeps its cursor, so the next one told the same run again, forever
        run = context.dagster_run
        steps = context.get_step_failure_events()
        # the failed steps' own errors (Laminar's one-line messages), else Dagster's run-level summary
        errors = [_step_error(e) for e in steps if e.step_failure_data.error or e.step_failure_data.user_failure_data]
        failed = sorted({e.step_key for e in steps if e.step_key})
        selection = sorted(k.to_user_string() for k in (run.asset_selection or ())) or failed
        start, end = run.tags.get("dagster/asset_partition_range_start"), run.tags.get("dagster/asset_partition_range_end")
        alert = Alert(
            run_id=run.run_id, job=run.job_name,
            message="; ".join(errors) or context.failure_event.message or "run failed",
            assets=tuple(selection),
            partition_range=f"{start}..{end}" if start else (run.tags.get("dagster/partition") or
                                                            run.tags.get(PARTITION_TAG)),
            component=run.tags.get(COMPONENT_TAG),
            **_runs_again(context.instance, run, settings),
        )
        if not told(alert.attempt):
            context.log.info(f"not told: run {run.run_id} failed again; its partitions run again as attempt "
                             f"{alert.attempt} in {alert.runs_again_in_seconds:.0f} s (of a chain of runs again, the "
                             f"failures before attempts 1, 2, 4, 8, ... are told): {alert.message}")
        elif target == "log":
            context.log.error(alert.text)
        else:
            send(target, alert)

    return _report


def _step_error(event) -> str:
    """A failed step's own message: the `dagster.Failure`'s description Laminar's assets give (its one line), else
    the error's message without the exception's class in front."""
    data = event.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description.strip()
    message = data.error.message.strip()
    head, sep, rest = message.partition(": ")
    return rest if sep and data.error.cls_name and head.endswith(data.error.cls_name) else message


def build_recovery_sensor(settings: LaminarSettings) -> dg.SensorDefinition:
    target = settings.alert

    @dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, name=RECOVERY_SENSOR_NAME,
                          default_status=dg.DefaultSensorStatus.RUNNING,
                          description=f"Tells the alert target ({target}) when a run that ran a failed run's "
                                      "partitions again succeeded: the outage its failure alerts told of is over.")
    def _report(context: dg.RunStatusSensorContext) -> None:
        run = context.dagster_run
        first = run.tags.get(resume.RESUME_OF_TAG)
        if not first:  # not a SkipReason: a tick whose runs return both fails (see the failure sensor)
            return
        start, end = run.tags.get("dagster/asset_partition_range_start"), run.tags.get("dagster/asset_partition_range_end")
        attempt = run.tags.get(resume.RESUME_ATTEMPT_TAG, "1")
        alert = Alert(
            run_id=run.run_id, job=run.job_name,
            message=f"the partitions of failed run {first} are up to date again (attempt {attempt})",
            assets=tuple(sorted(k.to_user_string() for k in (run.asset_selection or ()))),
            partition_range=f"{start}..{end}" if start else run.tags.get("dagster/partition"),
            component=run.tags.get(COMPONENT_TAG), attempt=int(attempt), recovered_from=first,
        )
        if target == "log":
            context.log.info(alert.text)
        else:
            send(target, alert)

    return _report
