"""Dagster assets built from flow and stage specs; a thin adapter over the engine."""


import time
from datetime import timedelta
from typing import cast

import dagster as dg

from laminar_assets.contracts.expectations import warm_up
from laminar_assets.engine import (
    Granularity,
    LaminarError,
    Mode,
    RefreshPolicy,
    RunResult,
    Spec,
    record_refused_run,
)
from laminar_assets.engine.delta import checkout_info, resolve_uri, table_info
from laminar_assets.orchestration.check_partitions import CHANGED_KEY
from laminar_assets.orchestration.table_metadata import table_metadata
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource

PARTITION_TAG = "laminar/partition"
COMPONENT_TAG = "laminar/component"  # runs of one connected part of the graph queue behind each other
FORCE_TAG = "laminar/force_refill"  # "true": recompute the partitions (reason FORCED_BY_USER)


def pool_name(spec: Spec) -> str:
    """The asset's concurrency pool."""
    return f"laminar_{spec.name}"


def partitions_def(spec: Spec, settings: LaminarSettings) -> dg.TimeWindowPartitionsDefinition:
    """Hourly or daily partitions from the spec's `start` (else the project's `partitions_start`); the
    current (incomplete) partition is included."""
    start = spec.start or settings.partitions_start
    if spec.granularity is Granularity.HOURLY:
        return dg.HourlyPartitionsDefinition(start_date=start, end_offset=1)
    return dg.DailyPartitionsDefinition(start_date=start, end_offset=1)


def source_tables(specs: list[Spec]) -> list[str]:
    """Inputs that no spec produces: the Delta tables the pipeline starts from."""
    produced = {s.sink for s in specs}
    inputs = []
    for s in specs:
        for t in (*s.sources, *s.dimension_tables):
            if t not in produced and t not in inputs:
                inputs.append(t)
    return inputs


def build_source_asset(table: str) -> dg.SourceAsset:
    @dg.observable_source_asset(name=table, group_name="sources", description=f"Delta table `{table}`; "
                                "its data version is the Delta table version.")
    def _observe(context, laminar: LaminarResource) -> dg.ObserveResult:
        uri = resolve_uri(laminar.resolved_root(), table)
        version = table_info(table, uri).version
        return dg.ObserveResult(data_version=dg.DataVersion(str(version)), metadata={"delta_version": version})

    return _observe


def _static_metadata(spec: Spec, readers: tuple[str, ...]) -> dict:
    # Spec.__post_init__ made `refresh` a RefreshPolicy
    md: dict[str, object] = {"spec_hash": spec.spec_hash, "sources": ", ".join(spec.sources),
                             "event_time": spec.event_time, "refresh": cast(RefreshPolicy, spec.refresh).value,
                             "sink_table": spec.sink}
    if len(readers) > 1:
        md["shared_by"] = ", ".join(readers)
    if spec.definition:
        md["defined_in"] = spec.origin
        md["sql"] = dg.MetadataValue.md(f"```sql\n{spec.definition}\n```")
    for name, text, markdown in spec.definition_facts():
        md[name] = dg.MetadataValue.md(text) if markdown else text
    return md


def run_metadata(result: RunResult) -> dict:
    """Metadata of one partition's run. Numbers stay numbers so the Dagster UI plots them."""
    p = result.plan
    m = result.metrics
    md: dict = {
        "mode": p.mode.value,
        "reason": p.reason.value,
        "detail": p.detail,
        "versions_from": dg.MetadataValue.json({k: v for k, v in p.from_versions.items()}),
        "versions_to": dg.MetadataValue.json(dict(p.to_versions)),
        "pending_versions": int(m.get("pending_versions", sum(p.pending_versions.values()))),
        "other_partitions_touched": dg.MetadataValue.json(list(p.other_partitions)),
        "refill_scope": dg.MetadataValue.json([[r.start.isoformat(), r.end.isoformat()] for r in p.refill]),
    }
    if p.group_windows:  # windows (stage: partitions) where only some groups or keys were recomputed
        md["group_refill_scope"] = dg.MetadataValue.json([[r.start.isoformat(), r.end.isoformat()]
                                                          for r in p.group_windows])
    for src, version in p.to_versions.items():
        md[f"source_version_{src}"] = int(version)
    md.update(m.shown_values())  # the measured ones (docs/dagster.md lists them)
    if m.get("change_rows"):
        md["rows_read_per_change"] = float(round(m.get("rows_read", 0) / m["change_rows"], 4))
    md["quarantined_by_rule"] = dg.MetadataValue.json(dict(result.quarantined))
    if result.sweep is not None:  # the flow's sweep of rows no partition owns: what it read, and why
        md["sweep"] = result.sweep.detail
        md["sweep_reason"] = result.sweep.reason.value if result.sweep.reason else "NEW_VERSIONS"
        md["sweep_quarantined"] = int(sum(result.sweep.counts.values()))
    for stage in ("plan", "read", "state", "merge", "write", "watermark"):
        md[f"seconds_{stage}"] = float(round(result.seconds.get(stage, 0.0), 4))
    md["seconds_total"] = float(round(sum(result.seconds.values()), 4))
    return md


def _guard_sources(spec: Spec, contracts: dict, root: str) -> dict:
    """Check each source with a contract against its Delta schema before anything is read."""
    from laminar_assets.contracts.guard import guard_source
    from laminar_assets.engine.run import columns_used

    added = {}
    for src in (*spec.sources, *spec.dimension_tables):
        if src not in contracts:
            continue
        # the snapshot the run takes next (on an object store the process's pooled one, opened here from the
        # source's checkpoint: the run's gather then lists its log once instead of opening it again)
        info, release = checkout_info(src, resolve_uri(root, src))
        try:
            report = guard_source(contracts[src], info.schema, info.version, columns_used(spec, src))
        finally:
            release()
        if report.added_columns:
            added[src] = list(report.added_columns)
    return added


def build_asset(spec: Spec, settings: LaminarSettings, contracts: dict | None = None, *,
                readers: tuple[str, ...] = ()) -> dg.AssetsDefinition:
    """The partitioned asset of one spec: a materialization brings its partitions up to date.
    `readers`: the specs that read its sink (two or more make it a shared stage in the UI)."""
    contracts = contracts or {}
    inputs = (*spec.sources, *spec.dimension_tables)
    shared = len(readers) > 1
    description = spec.description or f"{spec.kind} `{spec.name}`"
    if shared:
        description += f" Shared stage: read by {', '.join(readers)}."

    @dg.asset(
        name=spec.name,
        partitions_def=partitions_def(spec, settings),
        deps=[dg.AssetKey(t) for t in inputs],
        description=description,
        group_name=spec.group_name,
        kinds={"spark", "delta", *(("sql",) if spec.definition else ())},
        backfill_policy=dg.BackfillPolicy.single_run(),
        metadata=_static_metadata(spec, readers),
        code_version=spec.spec_hash,
        pool=pool_name(spec),  # one step of this asset at a time across runs (dagster.yaml: default_limit 1)
        owners=list(spec.owners),
        tags={**dict(spec.tags), **({"laminar/shared": "true"} if shared else {})},
        # a duration: Spec.__post_init__ parsed "5m" and the like
        freshness_policy=dg.FreshnessPolicy.time_window(fail_window=cast(timedelta, spec.target_lag))
        if spec.target_lag else None,
        # Only failures marked retryable are retried (see _failure); runs are idempotent, so a retry
        # after a partial commit settles it instead of applying it twice.
        retry_policy=dg.RetryPolicy(max_retries=settings.retries, delay=settings.retry_delay_seconds,
                                    backoff=dg.Backoff.EXPONENTIAL) if settings.retries else None,
    )
    def _asset(context: dg.AssetExecutionContext, laminar: LaminarResource) -> dg.MaterializeResult:
        if spec.sink in contracts:  # the contract check runs next: load Great Expectations meanwhile
            warm_up()
        try:
            added = _guard_sources(spec, contracts, laminar.resolved_root())
        except LaminarError as exc:  # counted like a failed run: status and check show the flow failing
            record_refused_run(laminar.checkpoints(), spec, list(context.partition_keys), context.run_id, exc)
            raise _failure(exc, {}, last=context.retry_number >= settings.retries) from None
        session_started = time.perf_counter()
        # the run's Spark: a Connect client in a deployment, else a local JVM
        engine = laminar.engine(**settings.engine_options())
        session_s = time.perf_counter() - session_started
        keys = list(context.partition_keys)
        force = context.run.tags.get(FORCE_TAG) == "true"
        started = time.perf_counter()
        try:  # a partition range shares its Spark jobs and commits (Engine.run_many)
            results: list[RunResult] = engine.run_many(spec, keys, force=force)
        except LaminarError as exc:
            raise _failure(exc, {"partitions": f"{keys[0]}..{keys[-1]}"},
                           last=context.retry_number >= settings.retries) from None
        # One log entry per step, a line per partition: each entry is an event the instance stores
        # (a database write), and the lines read the same in the run's log.
        lines = [f"{spec.name} {key}: {result.mode.value} ({result.reason.value}) — {result.detail}"
                 for key, result in zip(keys, results) if result.mode.value != "NOOP" or len(keys) == 1]
        if len(lines) < len(keys):
            lines.append(f"{spec.name}: {len(keys) - len(lines)} other partition(s) of the range had nothing to do "
                         "(NOOP, no Spark job)")
        context.log.info("\n".join(lines))
        table, by_partition = table_metadata(spec, engine.layout.sink_uri(spec), keys, table_name=engine.catalog_name(spec))
        table.update(recent_rates(context.instance, spec, results))
        if len(results) == 1:
            md = {**run_metadata(results[0]), **table, **by_partition.get(keys[0], {})}
            md["source_columns_added"] = dg.MetadataValue.json(added)
            md["preview"] = _preview(engine, spec, keys[0])
            md["seconds_spark_session"] = float(round(session_s, 4))
            return dg.MaterializeResult(metadata=md)
        # A range run records one materialization per partition: each carries that partition's own
        # mode, reason, versions and metrics (the partition page and the per-partition plots read
        # them), on top of the range's summary below.
        for key, result in zip(keys, results):
            context.add_asset_metadata({**run_metadata(result), **by_partition.get(key, {})}, partition_key=key)
        md = {**_range_metadata(results, time.perf_counter() - started), **table}
        md["seconds_spark_session"] = float(round(session_s, 4))
        return dg.MaterializeResult(metadata=md)

    return _asset


RECENT = 100  # partition materializations the rolling rates cover
RECENT_MODES = "recent_modes"
"""Metadata key: the modes of the asset's last `RECENT` partition runs, a letter each (`MODE_LETTERS`),
newest first. Each materialization carries it, so the next run reads one record of the event log for its
rates instead of a hundred (60-80 ms of a step holding the GIL at a hundred)."""
MODE_LETTERS = {Mode.INCREMENTAL.value: "I", Mode.REFILL.value: "R", Mode.NOOP.value: "N"}


def recent_rates(instance: dg.DagsterInstance, spec: Spec, results: list[RunResult]) -> dict:
    """Hit and fallback rates over the asset's last `RECENT` partition runs, this run's included, as
    numbers the UI plots over time: from the latest materialization's `recent_modes` (one record of
    Dagster's event log; no lake reads, so a run's latency stays what it was), or, when it has none (a
    materialization Laminar recorded before it kept them), from the last `RECENT` materializations.
    `laminar status` and `laminar_system.flow_stats` give them over any period."""
    modes = "".join(MODE_LETTERS[r.mode.value] for r in reversed(results))[:RECENT]
    if len(modes) < RECENT:
        modes += _earlier_modes(instance, dg.AssetKey(spec.name), RECENT - len(modes))
    worked = modes.replace("N", "")
    out = {"recent_partition_runs": len(modes),
           "recent_incremental_share": float(round(modes.count("I") / len(modes), 4)),
           "recent_refill_share": float(round(modes.count("R") / len(modes), 4)),
           "recent_noop_share": float(round(modes.count("N") / len(modes), 4)),
           RECENT_MODES: modes}
    if worked:
        out["recent_hit_rate"] = float(round(worked.count("I") / len(worked), 4))
    return out


def _earlier_modes(instance: dg.DagsterInstance, key: dg.AssetKey, count: int) -> str:
    """The modes of the asset's `count` partition runs before this run, newest first."""
    latest = instance.fetch_materializations(key, limit=1).records
    if not latest:
        return ""
    md = latest[0].asset_materialization.metadata if latest[0].asset_materialization else {}
    if RECENT_MODES in md:
        return cast(str, md[RECENT_MODES].value)[:count]
    modes = ""
    for record in instance.fetch_materializations(key, limit=count).records:
        md = record.asset_materialization.metadata if record.asset_materialization else {}
        if "mode" in md:  # the text a run of this asset recorded (a Mode's value)
            modes += MODE_LETTERS.get(cast(str, md["mode"].value), "")
    return modes


def _failure(exc: LaminarError, metadata: dict, *, last: bool) -> dg.Failure:
    """A Dagster failure carrying the error's facts; retried by the asset's RetryPolicy only when the
    error says running again may succeed (a conflict, a held lease, a lost Spark connection). The last
    attempt fails without asking for a retry, so the step keeps this message instead of Dagster's
    'Exceeded max_retries'."""
    retry = exc.retryable and not last
    description = str(exc) if retry or not exc.retryable else f"{exc} (after the retries this error allows)"
    return dg.Failure(description=description, metadata={**metadata, **{k: str(v) for k, v in exc.facts.items()},
                                                         "retryable": exc.retryable},
                      allow_retries=retry)


def _range_metadata(results: list[RunResult], seconds: float) -> dict:
    """The summary every partition of a range run shares (their own metrics are partition-scoped)."""
    modes: dict[str, int] = {}
    for r in results:
        modes[r.mode.value] = modes.get(r.mode.value, 0) + 1
    changed = [r for r in results if r.mode.value != "NOOP"]
    return {
        "partitions": len(results),
        "range_seconds_total": float(round(seconds, 4)),
        "modes": dg.MetadataValue.json(modes),
        # the partitions this run changed, with how (checks read it to skip unchanged partitions)
        CHANGED_KEY: dg.MetadataValue.json({r.plan.partition: f"{r.mode.value} ({r.reason.value})" for r in changed}),
    }


def _preview(engine, spec: Spec, key: str) -> dg.MetadataValue:
    try:
        frame = engine.preview(spec, key, limit=5)
    except LaminarError as exc:
        return dg.MetadataValue.text(f"no preview: {exc.message}")
    if frame.empty:
        return dg.MetadataValue.text("(no rows in this partition)")
    return dg.MetadataValue.md(frame.to_markdown(index=False))  # tabulate comes with dagster

