"""A failed run's partitions run again without a human: the pipeline sensor requests them after a pause that
doubles with every failed attempt, for as long as the failure is one a retry may fix (resume.py).

The failed runs are real Dagster runs of the part's assets: an asset named like the part's flow raises the
failure Laminar's own assets raise (`assets._failure`), so the step failure and its metadata are Dagster's."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from laminar_assets.definitions import specs_with_contracts
from laminar_assets.engine import CommitConflictError, Engine, EngineOptions, SpecError
from laminar_assets.flows import load_specs
from laminar_assets.orchestration import resume
from laminar_assets.orchestration.assets import _failure, build_asset, partitions_def
from laminar_assets.orchestration.checks import build_equivalence_check
from laminar_assets.orchestration.internals.in_process import execute_request
from laminar_assets.orchestration.sensors import RANGE_END, RANGE_START, build_pipeline_sensor, range_requests
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource
from tests.orchestration.pipeline import BASE, create_sources, trades
from tests.reference import assert_frames_match, full_recompute

SPECS, _ = specs_with_contracts(load_specs())
BY_NAME = {s.name: s for s in SPECS}
[PART] = components(SPECS)
PAUSE = 30.0  # the default: the tests move the sensor's clock (`later`), so a loaded machine changes nothing
SETTINGS = LaminarSettings(sensor_watch_seconds=0, resume_seconds=PAUSE)
P9, P10 = "2024-01-02-09:00", "2024-01-02-10:00"


def tick(laminar, instance, cursor, settings=SETTINGS):
    sensor = build_pipeline_sensor(PART, settings, blocking=set(), contracts={"normalized_trades"})
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"laminar": laminar}) as ctx:
        return sensor(ctx)


def failed_run(instance, error, *, tags=None, partitions=(P9,)) -> str:
    """A run of the part's `vwap_1m` that fails as Laminar's asset fails on `error`, after its retries."""
    @dg.asset(name="vwap_1m", partitions_def=partitions_def(BY_NAME["vwap_1m"], SETTINGS))
    def _broken():
        raise _failure(error, {}, last=True)

    span = {"partition_key": partitions[0]} if len(partitions) == 1 else \
        {"tags": {RANGE_START: partitions[0], RANGE_END: partitions[-1]}}
    job = dg.Definitions(assets=[_broken]).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, raise_on_error=False, asset_selection=[_broken.key],
                                    tags={"laminar/component": PART.name, **(tags or {}), **span.pop("tags", {})},
                                    **span)
    assert not result.success
    return result.run_id


@pytest.fixture
def later(monkeypatch):
    """later(seconds): the sensor's clock (and the alerts') that many seconds ahead of the real one from now on."""
    ahead = [0.0]
    real = resume.now
    monkeypatch.setattr(resume, "now", lambda: real() + ahead[0])

    def move(seconds: float) -> None:
        ahead[0] = seconds

    return move


WAITS = r"in (29|30) s, attempt {}$"  # 30 s less the time since the run ended (well under a second)


def skipped(result) -> str:
    """A tick's skip message (a skip that also moves the cursor is a result with a skip reason); fails on requests."""
    assert not getattr(result, "run_requests", None), result
    return result.skip_message if isinstance(result, dg.SkipReason) else result.skip_reason.skip_message


def test_a_run_that_failed_for_a_transient_reason_runs_again_after_a_pause_that_doubles(lake, laminar, instance,
                                                                                        later):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor  # the first run's request (not launched here)
    first = failed_run(instance, CommitConflictError("injected: the store stopped answering"),
                       partitions=(P9, P10))
    waiting = skipped(tick(laminar, instance, cursor))
    assert waiting.startswith("no new versions of raw_trades, symbols, normalized_trades; failed runs of raw_trades "
                              f"whose partitions run again (the pause doubles): {first} (injected: the store "
                              "stopped answering"), waiting
    assert re.search(WAITS.format(1), waiting), waiting
    later(PAUSE + 1)
    again = tick(laminar, instance, cursor)
    [request] = again.run_requests
    assert {k.to_user_string() for k in request.asset_selection} == {"vwap_1m"}
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == (P9, P10)
    assert request.tags[resume.RESUME_OF_TAG] == first and request.tags[resume.RESUME_ATTEMPT_TAG] == "1"
    assert f"+again:{first}" in request.run_key
    assert {c.name for c in request.asset_check_keys} == {"equivalence"}
    cursor = again.cursor
    assert "run again" not in skipped(tick(laminar, instance, cursor))  # once: the cursor handled it

    # the run again fails too: the next attempt waits twice as long, and names the first run of the chain
    second = failed_run(instance, CommitConflictError("injected: still down"), tags=request.tags | {},
                        partitions=(P9, P10))
    later(0)
    assert re.search(r"in (59|60) s, attempt 2$", skipped(tick(laminar, instance, cursor)))
    later(PAUSE + 1)  # one pause: not yet
    assert re.search(WAITS.format(2), skipped(tick(laminar, instance, cursor)))
    later(2 * PAUSE + 1)
    again = tick(laminar, instance, cursor)
    [request] = again.run_requests
    assert request.tags[resume.RESUME_OF_TAG] == first and request.tags[resume.RESUME_ATTEMPT_TAG] == "2"
    assert f"+again:{second}" in request.run_key

    # a handled run written to later (a tag added, as Dagster's run retries add one) is not run again
    instance.add_run_tags(first, {"note": "looked at"})
    instance.add_run_tags(second, {"note": "looked at"})
    assert "run again" not in skipped(tick(laminar, instance, again.cursor))


def test_every_failed_run_that_waits_is_told_not_only_the_last_run(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    first = failed_run(instance, CommitConflictError("injected: one"), partitions=(P9,))
    second = failed_run(instance, CommitConflictError("injected: two"), partitions=(P10,))
    job = dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(assets=[dg.AssetSpec("x")]).resolve_asset_graph())
    later = instance.create_run_for_job(job, tags={"laminar/component": PART.name}, status=dg.DagsterRunStatus.SUCCESS)
    message = skipped(tick(laminar, instance, cursor))
    assert later.run_id not in message and "failed runs of raw_trades whose partitions run again" in message
    assert f"{first} (injected: one" in message and f"{second} (injected: two" in message


def test_a_failed_run_joins_the_run_a_new_commit_requests(lake, laminar, instance, later):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    failed = failed_run(instance, CommitConflictError("injected"), partitions=(P9,))
    later(PAUSE + 1)
    lake.append("raw_trades", frame=trades([(9, "2024-01-02 10:30:00", "MSFT", "ACC-3", "BUY", 411.0, 10)]))
    [request] = tick(laminar, instance, cursor).run_requests  # one run: the commit's partitions and the failed one's
    assert request.tags[RANGE_START] <= P9 and request.tags[RANGE_END] == P10
    assert request.tags[resume.RESUME_OF_TAG] == failed


def test_a_failure_a_retry_does_not_fix_waits_for_a_human(lake, laminar, instance):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    failed = failed_run(instance, SpecError("column 'prize' not found", flow="vwap_1m", field="aggregates"))
    message = skipped(tick(laminar, instance, cursor))
    assert f"the last run of raw_trades, {failed}, failed with an error a retry does not fix (column 'prize' not " \
           "found" in message
    assert "laminar refill" in message


def test_a_canceled_run_is_not_run_again_and_resume_seconds_0_turns_it_off(lake, laminar, instance, later):
    create_sources(lake, BASE)
    cursor = tick(laminar, instance, None).cursor
    failed = failed_run(instance, CommitConflictError("injected"))
    off = LaminarSettings(sensor_watch_seconds=0, resume_seconds=0)
    later(PAUSE + 1)
    result = tick(laminar, instance, cursor, settings=off)
    assert f"{failed}, failed (injected (after the retries this error allows)), and resume_seconds is 0 (failed runs " \
           "do not run again): its partitions wait for a new commit" in skipped(result)
    cursor = result.cursor  # handled: turning resume on later does not run it again
    job = dg.define_asset_job("j").resolve(asset_graph=dg.Definitions(assets=[dg.AssetSpec("x")]).resolve_asset_graph())
    run = instance.create_run_for_job(job, tags={"laminar/component": PART.name}, status=dg.DagsterRunStatus.STARTED)
    instance.report_run_canceled(run)
    assert f"{run.run_id}, ended CANCELED" in skipped(tick(laminar, instance, cursor))


def test_a_longest_pause_shorter_than_the_first_is_refused():
    with pytest.raises(ValueError, match=r"expected at least resume_seconds \(60 s\), found 10 s"):
        LaminarSettings(resume_seconds=60, resume_max_seconds=10)


def test_a_long_reason_loses_its_facts_before_it_is_cut():
    why = "could not reach Postgres at 127.0.0.1:55432: " + "x" * 250 + " [export=vwap_1m_pg, host=127.0.0.1]"
    assert resume._one_line(why) == why[:why.rindex(" [")]
    assert resume._one_line("y" * 400).endswith("...") and len(resume._one_line("y" * 400)) == 300


@pytest.mark.parametrize(("attempt", "seconds"), [(1, 30), (2, 60), (5, 480), (6, 600), (40, 600)])
def test_the_pause_doubles_up_to_its_longest(attempt, seconds):
    assert resume.pause_seconds(attempt, first=30, longest=600) == seconds


def test_the_cursor_keeps_a_run_that_waits_and_forgets_what_its_time_covers():
    def run(run_id, ended, due, retryable=True):
        return resume.FailedRun(run_id=run_id, ended=ended, retryable=retryable, why="x", attempt=1,
                                first_run_id=run_id, due=due, assets=("a",), partition_tags={})

    seen = resume.Failures(after=100.0)
    waiting, done, fixed = run("w", 110, due=200), run("d", 120, due=150), run("f", 130, due=float("inf"), retryable=False)
    due, seen = resume.advance(seen, [waiting, done, fixed], now=160)
    assert due == [done]
    assert seen.after == 100 and set(seen.handled) == {"d", "f"}  # 'w' is looked at again
    due, seen = resume.advance(seen, [waiting], now=210)
    assert due == [waiting] and seen.after == 130 and not seen.handled
    assert resume.advance(seen, [], now=300) == ([], seen)
    assert resume.Failures.parse(seen.to_json(), now=0) == seen
    assert resume.Failures.parse(None, now=5.0) == resume.Failures(after=5.0)


class StoreDown(LaminarResource):
    """Every run fails as one does while the lake's store does not answer, until the store is back."""

    def engine(self, **options) -> Engine:
        def hook(step: str) -> None:
            if DOWN:
                raise CommitConflictError(f"injected at {step}: the store does not answer")

        return Engine(self.spark.get_session(), self.resolved_root(), hook=hook,
                      options=EngineOptions(lease_seconds=self.lease_seconds, **options))


DOWN: list[bool] = []


@pytest.mark.spark
def test_a_run_whose_retries_ran_out_is_run_again_by_the_sensor_and_catches_up(spark, lake, laminar, instance,
                                                                                later):
    """The whole path on real assets: a sensor's run fails on every retry while the store is down; once the pause
    ends the sensor asks for its partitions again, and that run (the store back) brings them up to date."""
    create_sources(lake, BASE)
    settings = LaminarSettings(sensor_watch_seconds=0, resume_seconds=PAUSE, retries=1, retry_delay_seconds=0)
    stage, flow = BY_NAME["normalized_trades"], BY_NAME["vwap_1m"]
    defs = dg.Definitions(assets=[build_asset(stage, settings), build_asset(flow, settings)],
                          asset_checks=[build_equivalence_check(flow, settings)],
                          resources={"laminar": StoreDown(root=laminar.root, spark=laminar.spark)})
    [stage_run] = range_requests({stage: [P9]}, settings, run_key="stage", tags={"laminar/component": PART.name})
    assert execute_request(defs, stage_run, instance).success
    cursor = tick(laminar, instance, None, settings).cursor  # its requests stand for runs that succeeded
    [request] = range_requests({flow: [P9]}, settings, run_key="first", tags={"laminar/component": PART.name})
    DOWN[:] = [True]
    failed = execute_request(defs, request, instance)
    assert not failed.success
    assert len([e for e in failed.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]) == 1
    DOWN.clear()
    later(PAUSE + 1)
    [again] = tick(laminar, instance, cursor, settings).run_requests
    assert {k.to_user_string() for k in again.asset_selection} == {"vwap_1m"}
    assert again.partition_key == P9 and again.tags[resume.RESUME_OF_TAG] == failed.run_id
    outcome = execute_request(defs, again, instance)
    assert outcome.success
    [check] = outcome.get_asset_check_evaluations()
    assert check.passed  # the run again equals a full recompute at its watermark
    expected = full_recompute(spark, flow, lake.table("normalized_trades").to_pyarrow_table())
    assert_frames_match(lake.read("vwap_1m"), expected, flow.keys)


def test_the_alert_of_a_failed_run_says_when_its_partitions_run_again(instance):
    """Each failed attempt of a long outage is alerted: the alert says no one needs to act yet."""
    from laminar_assets.orchestration.alerts import Alert, _runs_again

    transient = instance.get_run_by_id(failed_run(instance, CommitConflictError("injected")))
    again = _runs_again(instance, transient, SETTINGS)
    assert again["attempt"] == 1 and 0 < again["runs_again_in_seconds"] <= PAUSE
    alert = Alert(transient.run_id, "job", "boom", ("vwap_1m",), P9, PART.name, **again)
    assert alert.text.endswith(f"failed: boom (its partitions run again in {again['runs_again_in_seconds']:.0f} s, "
                               "attempt 1)")
    fixed = instance.get_run_by_id(failed_run(instance, SpecError("bad", flow="vwap_1m", field="aggregates")))
    assert _runs_again(instance, fixed, SETTINGS) == {}
    assert _runs_again(instance, transient, LaminarSettings(resume_seconds=0)) == {}


RECEIVED: list = []


def receive(alert) -> None:
    """An alert target ('package.module:function')."""
    RECEIVED.append(alert)


def test_a_run_again_that_succeeds_is_told_to_the_alert_target(instance):
    """Its failure alerts told of an outage; the success of the run that ran its partitions again says it is over."""
    from laminar_assets.orchestration.alerts import build_recovery_sensor

    @dg.asset(name="vwap_1m", partitions_def=partitions_def(BY_NAME["vwap_1m"], SETTINGS))
    def _fine():
        return None

    job = dg.Definitions(assets=[_fine]).resolve_implicit_global_asset_job_def()
    sensor = build_recovery_sensor(LaminarSettings(alert="tests.orchestration.test_resume:receive"))
    RECEIVED.clear()
    for tags in ({"laminar/component": PART.name},
                 {"laminar/component": PART.name, resume.RESUME_OF_TAG: "first-run", resume.RESUME_ATTEMPT_TAG: "3"}):
        result = job.execute_in_process(instance=instance, asset_selection=[_fine.key], partition_key=P9, tags=tags)
        [success] = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.RUN_SUCCESS)
        context = dg.build_run_status_sensor_context(sensor_name=sensor.name, dagster_instance=instance,
                                                     dagster_run=result.dagster_run, dagster_event=success.dagster_event)
        sensor(context)
    [alert] = RECEIVED  # the plain run's success is not told
    assert alert.recovered_from == "first-run" and alert.attempt == 3 and alert.assets == ("vwap_1m",)
    assert alert.text.endswith(f"(vwap_1m partitions {P9}) succeeded: the partitions of failed run first-run are up "
                               "to date again (attempt 3)")


def test_a_long_outage_is_told_before_attempts_1_2_4_8(instance):
    """Every failed attempt of a chain runs again, but the alert target hears of the failures before attempts 1, 2,
    4 and 8 only (an hour's outage: four alerts, not nine); a failure that does not run again is always told."""
    from laminar_assets.orchestration.alerts import build_failure_sensor

    sensor = build_failure_sensor(LaminarSettings(alert="tests.orchestration.test_resume:receive"))
    RECEIVED.clear()
    chain = [{}] + [{resume.RESUME_OF_TAG: "first-run", resume.RESUME_ATTEMPT_TAG: str(k)} for k in range(1, 9)]
    for tags in chain:
        run_id = failed_run(instance, CommitConflictError("injected"), tags=tags)
        [entry] = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name, dagster_instance=instance, dagster_run=instance.get_run_by_id(run_id),
            dagster_event=entry.dagster_event).for_run_failure()
        assert sensor(context) is None  # told or not: never a SkipReason (see the tick test below)
    assert [a.attempt for a in RECEIVED] == [1, 2, 4, 8]
    # the step's own line (the Failure's description), without Dagster's exception class in front
    assert all(a.message.startswith("injected") for a in RECEIVED), RECEIVED[0].message
    RECEIVED.clear()
    fixed = failed_run(instance, SpecError("bad", flow="vwap_1m", field="aggregates"),
                       tags={resume.RESUME_OF_TAG: "first-run", resume.RESUME_ATTEMPT_TAG: "2"})
    [entry] = instance.all_logs(fixed, of_type=dg.DagsterEventType.RUN_FAILURE)
    sensor(dg.build_run_status_sensor_context(sensor_name=sensor.name, dagster_instance=instance,
                                              dagster_run=instance.get_run_by_id(fixed),
                                              dagster_event=entry.dagster_event).for_run_failure())
    [alert] = RECEIVED  # an error a run again does not fix: told, whatever the attempt
    assert alert.attempt is None and "bad" in alert.message


def test_a_tick_over_told_and_untold_runs_tells_each_once_and_moves_on(instance):
    """One tick of the failure sensor over a told failure and an untold one (the failure before attempt 3), and of
    the recovery sensor over a plain success and a run again's: each tick ends well (Dagster fails a tick whose
    runs return both a SkipReason and a reaction, and a failed tick's runs were told again at every tick)."""
    from laminar_assets.orchestration.alerts import build_failure_sensor, build_recovery_sensor

    settings = LaminarSettings(alert="tests.orchestration.test_resume:receive")
    failures, recoveries = build_failure_sensor(settings), build_recovery_sensor(settings)
    defs = dg.Definitions(sensors=[failures, recoveries])

    def tick(sensor, cursor):
        with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs) as context:
            return sensor.evaluate_tick(context)

    cursors = {s.name: tick(s, None).cursor for s in (failures, recoveries)}  # a first tick starts from now
    RECEIVED.clear()
    told = failed_run(instance, CommitConflictError("injected"))
    failed_run(instance, CommitConflictError("injected"), tags={resume.RESUME_OF_TAG: told,
                                                              resume.RESUME_ATTEMPT_TAG: "2"})

    @dg.asset(name="vwap_1m", partitions_def=partitions_def(BY_NAME["vwap_1m"], SETTINGS))
    def _fine():
        return None

    job = dg.Definitions(assets=[_fine]).resolve_implicit_global_asset_job_def()
    for tags in ({"laminar/component": PART.name},
                 {"laminar/component": PART.name, resume.RESUME_OF_TAG: told, resume.RESUME_ATTEMPT_TAG: "3"}):
        assert job.execute_in_process(instance=instance, asset_selection=[_fine.key], partition_key=P9,
                                      tags=tags).success
    for sensor in (failures, recoveries):
        for _ in range(2):  # the second tick finds nothing new
            result = tick(sensor, cursors[sensor.name])
            assert result.cursor != cursors[sensor.name] or _ == 1
            cursors[sensor.name] = result.cursor
    assert [(a.run_id == told, a.attempt, a.recovered_from) for a in RECEIVED] == [(True, 1, None), (False, 3, told)]
