"""The builder of Laminar's Dagster definitions: every asset, check, sensor, schedule and job of a list
of specs. This repository's `definitions.py` and `LaminarComponent` both build through it."""

from __future__ import annotations

import os
import pathlib
import warnings

import dagster as dg

from laminar_assets import storage
from laminar_assets.contracts import CONTRACTS, load_contracts, with_contract_rules
from laminar_assets.engine import ExportSpec, LaminarError, Spec, SpecError, check_exports, check_tables
from laminar_assets.errors import did_you_mean
from laminar_assets.orchestration.alerts import build_failure_sensor, build_recovery_sensor
from laminar_assets.orchestration.assets import build_asset, build_source_asset, source_tables
from laminar_assets.orchestration.checks import build_contract_check, build_equivalence_check, build_lag_check
from laminar_assets.orchestration.exports import build_export_asset
from laminar_assets.orchestration.internals.thread_executor import thread_executor
from laminar_assets.orchestration.schedules import build_schedule
from laminar_assets.orchestration.sensors import build_pipeline_sensors, build_stale_sensor
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource, SparkResource


def specs_with_contracts(specs: list[Spec], contracts_dir: str | pathlib.Path | None = CONTRACTS):
    """(the specs as deployed, with their sources' contract rules folded in; the contracts by table)."""
    if contracts_dir:
        _refuse_sinks_on_sources(specs, load_contracts(contracts_dir))
    known = {s.sink_name: cols for s in specs if (cols := s.output_columns())}
    contracts = load_contracts(contracts_dir, known) if contracts_dir else {}
    return [with_contract_rules(s, contracts) for s in specs], contracts


def _refuse_sinks_on_sources(specs: list[Spec], contracts: dict) -> None:
    """A sink named like a table whose contract says `kind: source` would replace that source on its first
    run (when no spec of this set reads it, `check_tables` cannot tell): refused here, in one line naming
    the flow, the table and the contract, before the contract is compared with the flow's output columns
    (which said only that the source's columns were missing)."""
    sources = {os.path.normpath(t).casefold(): c for t, c in contracts.items() if c.kind == "source"}
    for spec in specs:
        contract = sources.get(os.path.normpath(spec.sink_name).casefold())
        if contract is not None:
            where = f" ({spec.origin})" if spec.origin else ""
            raise SpecError(f"the sink '{spec.sink}' of {spec.kind} '{spec.name}'{where} is the source table "
                            f"'{contract.table}' (its contract {pathlib.Path(contract.path).name} says kind: source): "
                            "a run would replace its data; give the flow another sink",
                            flow=spec.name, field="sink", file=contract.path)


# Dagster marks four features Laminar relies on as beta/preview and warns each time they are used:
# in every process that loads the definitions (code server, each launched run), a dozen lines of
# dagster.log per run that bury what a user looks there for. Only these four are silenced.
_KNOWN_PREVIEWS = ((dg.BetaWarning, r"Parameter `backfill_policy` of function `asset`"),
                   (dg.BetaWarning, r"Function `observable_source_asset`"),
                   (dg.PreviewWarning, r"Specifying a partitions_def on an AssetCheckSpec"),
                   (dg.BetaWarning, r"Parameter `execution_type` of function `AssetsDefinition"))


def build_definitions(specs: list[Spec], settings: LaminarSettings, resources: dict | None = None,
                      contracts_dir: str | pathlib.Path | None = CONTRACTS, *,
                      thread_executor: bool = True, exports: list[ExportSpec] | tuple = ()) -> dg.Definitions:
    """Every asset, check, sensor, schedule and job of `specs` and `exports`, with the contracts in
    `contracts_dir`: the one builder of this repository's definitions and of `LaminarComponent`'s.
    `thread_executor`: runs use Laminar's thread executor (else the code location's default)."""
    with warnings.catch_warnings():
        for category, message in _KNOWN_PREVIEWS:
            warnings.filterwarnings("ignore", message=message, category=category)
        return _build_definitions(specs, settings, resources, contracts_dir, thread_executor, list(exports))


def _build_definitions(specs, settings, resources, contracts_dir, use_threads, exports) -> dg.Definitions:
    laminar = (resources or {}).get("laminar")
    root = getattr(laminar, "root", None)  # only a root given here (not an EnvVar): the environment is read at run time
    check_tables(specs, root=storage.resolve_root(root) if type(root) is str else None)
    check_exports(specs, exports)
    specs, contracts = specs_with_contracts(specs, contracts_dir)
    readers: dict[str, list[str]] = {}
    for s in specs:
        for src in (*s.sources, *s.dimension_tables):
            readers.setdefault(src, []).append(s.name)
    assets: list[dg.SourceAsset | dg.AssetsDefinition] = [build_source_asset(t) for t in source_tables(specs)]
    assets += [build_asset(s, settings, contracts, readers=tuple(readers.get(s.sink, ()))) for s in specs]
    by_name = {s.name: s for s in specs}
    assets += [build_export_asset(e, by_name[e.source], settings) for e in exports]
    checks = [build_lag_check(s) for s in specs]
    checks += [build_contract_check(s, contracts[s.sink], settings) for s in specs if s.sink in contracts]
    checks += [build_equivalence_check(s, settings) for s in specs if s.recompute_checked]
    blocking = {s.name for s in specs if s.sink in contracts and contracts[s.sink].blocking}
    sensors = build_pipeline_sensors(specs, settings, blocking=blocking,
                                     contracts={s.name for s in specs if s.sink in contracts}, exports=exports)
    sensors.append(build_stale_sensor(specs, settings))
    sensors.append(build_failure_sensor(settings))
    sensors.append(build_recovery_sensor(settings))
    jobs, schedules = [], []
    part_of = {s.name: c.name for c in components(specs) for s in c.specs}
    for name, cron in settings.schedules.items():
        if name not in by_name:
            raise LaminarError(f"schedule for unknown flow {name!r}: {did_you_mean(name, by_name)}expected one of "
                               f"{', '.join(sorted(by_name))}; "
                               "fix the name under `schedules`", flow=name, field="schedules")
        job, schedule = build_schedule(by_name[name], cron, settings, part_of[name])
        jobs.append(job)
        schedules.append(schedule)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        sensors=sensors,
        schedules=schedules,
        jobs=jobs,
        resources=resources or {"laminar": LaminarResource(spark=SparkResource())},
        executor=thread_executor if use_threads else None,
    )
