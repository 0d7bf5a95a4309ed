"""Finding flow and stage specs: every module of a package that defines them at top level."""

from __future__ import annotations

import importlib
import pkgutil
from graphlib import CycleError, TopologicalSorter
from types import ModuleType

from laminar_assets.errors import SpecError
from .spec import FlowSpec, StageSpec

Spec = FlowSpec | StageSpec


def collect_specs(package: ModuleType | str) -> list[Spec]:
    """Import every module of `package` and return the specs they define, in dependency order.

    A duplicate flow/stage name or sink, or a cycle between stages, is a `SpecError`
    naming the modules involved.
    """
    pkg = importlib.import_module(package) if isinstance(package, str) else package
    found: dict[str, tuple[Spec, str]] = {}
    sinks: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module_name = f"{pkg.__name__}.{info.name}"
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not isinstance(value, (FlowSpec, StageSpec)):
                continue
            if value.name in found:
                if found[value.name][0] is value:
                    continue
                raise SpecError(
                    f"duplicate flow name '{value.name}' in {module_name} and {found[value.name][1]}; "
                    "names must be unique", flow=value.name, field="name",
                )
            if value.sink in sinks:
                raise SpecError(
                    f"flows '{value.name}' and '{sinks[value.sink]}' both write sink table '{value.sink}'",
                    flow=value.name, field="sink",
                )
            found[value.name] = (value, module_name)
            sinks[value.sink] = value.name
    return order_specs([spec for spec, _ in found.values()])


def order_specs(specs: list[Spec]) -> list[Spec]:
    """Specs sorted so that a stage comes before every spec that reads its sink."""
    by_sink = {s.sink: s for s in specs}
    graph = {s.name: {by_sink[src].name for src in _inputs(s) if src in by_sink} for s in specs}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise SpecError(f"flows form a cycle: {' -> '.join(exc.args[1])}", flow=exc.args[1][0], field="source") from None
    names = {s.name: s for s in specs}
    return [names[n] for n in order]


def _inputs(spec: Spec) -> tuple[str, ...]:
    dims = spec.dimension_tables if isinstance(spec, StageSpec) else ()
    return tuple(spec.sources) + tuple(dims)
