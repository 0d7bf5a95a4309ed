"""Finding flow and stage specs: every module of a package that defines them at top level, and every
`.sql` file in the package's folder (CREATE MATERIALIZED VIEW statements, see `sql/views.py`)."""

from __future__ import annotations

import glob
import importlib
import os
import pkgutil
from graphlib import CycleError, TopologicalSorter
from types import ModuleType

from laminar_assets.errors import SpecError

from .spec.specs import FlowSpec, Spec, StageSpec
from .sql.views import compile_sql_file


def collect_specs(package: ModuleType | str) -> list[Spec]:
    """Import every module of `package`, compile its `.sql` files, and return the specs they define,
    in dependency order.

    A duplicate flow/stage name or sink (in Python, SQL or both), or a cycle between stages, is a
    `SpecError` naming the modules or files involved.
    """
    pkg = importlib.import_module(package) if isinstance(package, str) else package
    found: dict[str, tuple[Spec, str]] = {}
    sinks: dict[str, str] = {}

    def add(value: Spec, where: str) -> None:
        if value.name in found:
            if found[value.name][0] is value:
                return
            raise SpecError(
                f"duplicate flow name '{value.name}' in {where} and {found[value.name][1]}; names must be unique "
                "across Python modules and .sql files", flow=value.name, field="name",
            )
        if value.sink in sinks:
            raise SpecError(
                f"flows '{value.name}' ({where}) and '{sinks[value.sink]}' both write sink table '{value.sink}'",
                flow=value.name, field="sink",
            )
        found[value.name] = (value, where)
        sinks[value.sink] = value.name

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module_name = f"{pkg.__name__}.{info.name}"
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, (FlowSpec, StageSpec)):
                add(value, module_name)
    for folder in pkg.__path__:
        for path in sorted(glob.glob(os.path.join(folder, "*.sql"))):
            for value in compile_sql_file(path):
                add(value, value.origin)
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
    dims = spec.dimension_tables
    return tuple(spec.sources) + tuple(dims)
