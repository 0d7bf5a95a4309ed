"""Finding flow and stage specs: every module of a package (or `.py` file of a plain folder) that defines
them at top level, and every `.sql` file in that folder (CREATE MATERIALIZED VIEW statements, see
`sql/views.py`)."""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import os
import pathlib
import pkgutil
import sys
from graphlib import CycleError, TopologicalSorter
from types import ModuleType

from laminar_assets.errors import LaminarError, SpecError

from .spec.specs import FlowSpec, Spec, StageSpec
from .sql.views import compile_sql_file


def collect_specs(package: ModuleType | str | os.PathLike) -> list[Spec]:
    """Import every module of `package` (a package, its name, or a folder of `.py` files that need not
    be a package), compile its `.sql` files, and return the specs they define, in dependency order.

    A duplicate flow/stage name or sink (in Python, SQL or both), or a cycle between stages, is a
    `SpecError` naming the modules or files involved.
    """
    folder = _folder(package)
    pkg = None if folder else _import(package) if isinstance(package, str) else package
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

    modules = _folder_modules(folder) if folder else [
        (f"{pkg.__name__}.{info.name}", lambda name=f"{pkg.__name__}.{info.name}": importlib.import_module(name))
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name) if not info.name.startswith("_")]
    for module_name, load in modules:
        for value in vars(load()).values():
            if isinstance(value, (FlowSpec, StageSpec)):
                add(value, module_name)
    for where in [folder] if folder else pkg.__path__:
        for path in sorted(glob.glob(os.path.join(where, "*.sql"))):
            for value in compile_sql_file(path):
                add(value, value.origin)
    return order_specs([spec for spec, _ in found.values()])


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # the module exists; something it imports does not
        raise LaminarError(f"flows module {name!r} cannot be imported ({exc}): expected an importable package of "
                           "specs, or a folder path", field="flows") from None


def _folder(package) -> str | None:
    """The folder `package` names, when it is a path rather than a module (name)."""
    if isinstance(package, os.PathLike) or (isinstance(package, str) and (os.sep in package or os.path.isdir(package))):
        if not os.path.isdir(package):
            raise LaminarError(f"flows folder {os.fspath(package)!r} does not exist: expected a folder of .py and "
                               ".sql specs (or a module name such as 'laminar_assets.flows')", field="flows")
        return os.path.abspath(package)
    return None


def _folder_modules(folder: str) -> list[tuple[str, object]]:
    """(module name, loader) of each `.py` file of a plain folder. Each is imported under a name derived
    from the folder's path, so two folders' `flows.py` do not collide, and imported once per process."""
    prefix = "laminar_specs_" + hashlib.sha1(folder.encode()).hexdigest()[:10]
    out = []
    for path in sorted(pathlib.Path(folder).glob("*.py")):
        if path.name.startswith("_"):
            continue
        name = f"{prefix}.{path.stem}"

        def load(name=name, path=path):
            if name not in sys.modules:
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            return sys.modules[name]

        out.append((f"{os.path.basename(folder)}/{path.name}", load))
    return out


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
