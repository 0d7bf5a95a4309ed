"""Finding flow and stage specs, and exports: every module of a package (or `.py` file of a plain folder) that
defines them at top level, and every `.sql` file in that folder (CREATE MATERIALIZED VIEW and CREATE SINK
statements, see `sql/views.py`, `sql/sinks.py`)."""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import os
import pathlib
import pkgutil
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from types import ModuleType
from typing import cast

from laminar_assets.errors import LaminarError, SpecError, SqlDefinitionError

from .delta.layout import SYSTEM_FOLDER, place_of
from .spec.exports import ExportSpec, PostgresExport, RedisExport
from .spec.specs import SPEC_KINDS, Spec
from .sql.views import read_sql_file


@dataclass(frozen=True)
class Catalog:
    """What a flows package defines: its flows and stages in dependency order, and its exports, each after
    the spec it reads."""

    specs: list[Spec]
    exports: list[ExportSpec]

    def source_of(self, export: ExportSpec) -> Spec:
        """The flow or stage `export` reads (the registry checked that it is one of `specs`)."""
        return next(s for s in self.specs if s.name == export.source)


def collect_specs(package: ModuleType | str | os.PathLike) -> list[Spec]:
    """The flows and stages of `package`, in dependency order (`collect(package).specs`)."""
    return collect(package).specs


def collect(package: ModuleType | str | os.PathLike) -> Catalog:
    """Import every module of `package` (a package, its name, or a folder of `.py` files that need not
    be a package), compile its `.sql` files, and return the specs they define, in dependency order, and
    their exports.

    A duplicate name (flows, stages and exports share one namespace: each is an asset), two outputs in one
    folder (or one inside another), an output in a table the flows read but none writes or in Laminar's own
    `_laminar/` folder (see `check_tables`), a cycle between stages, or an export of something that is not a
    flow or stage of the package (see `check_exports`), is a `SpecError` naming the modules or files involved.
    """
    folder = _folder(package)
    found: dict[str, tuple[Spec | ExportSpec, str]] = {}
    files: dict[str, str] = {}  # spec or export name -> the file that defines it

    def add(value: Spec | ExportSpec, where: str, file: str) -> None:
        if value.name in found:
            if found[value.name][0] is value:
                return
            raise SpecError(
                f"duplicate {value.duplicate_noun} name '{value.name}' in "
                f"{where} and {found[value.name][1]}; names of flows, stages and exports must be unique across Python "
                "modules and .sql files", flow=value.name, field="name",
            )
        found[value.name] = (value, where)
        files[value.name] = file

    places: Iterable[str]  # where the .sql files are
    if folder:
        modules, places = _folder_modules(folder), [folder]
    else:  # a module or its name (`_folder` took every path)
        pkg = _import(package) if isinstance(package, str) else cast(ModuleType, package)
        modules = [
            (f"{pkg.__name__}.{info.name}", lambda name=f"{pkg.__name__}.{info.name}": importlib.import_module(name))
            for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name) if not info.name.startswith("_")]
        places = pkg.__path__
    for module_name, load in modules:
        module = _loaded(load, folder)
        file = module_name if folder else _shown(getattr(module, "__file__", None) or module_name)
        for value in vars(module).values():
            if isinstance(value, (*SPEC_KINDS, ExportSpec)):
                add(value, module_name, file)
    for where in places:
        for path in sorted(glob.glob(os.path.join(where, "*.sql"))):
            views, sinks = read_sql_file(path)
            for value in (*views, *sinks):
                add(value, value.origin, value.origin)
    specs = [v for v, _ in found.values() if not isinstance(v, ExportSpec)]
    exports = [v for v, _ in found.values() if isinstance(v, ExportSpec)]
    check_tables(specs, origins=files)
    ordered = order_specs(specs, origins=files)
    check_exports(ordered, exports, origins=files)
    return Catalog(ordered, order_exports(ordered, exports))


def _loaded(load, folder: str | None) -> ModuleType:
    """The module `load` imports; a spec it defines that is invalid raises its SpecError with the file and
    line of the definition in front (`flows/vwap_1m.py:12: FlowSpec 'vwap_1m': ...`)."""
    try:
        return load()
    except SqlDefinitionError:
        raise  # names its file already
    except SpecError as exc:
        engine = os.path.dirname(os.path.abspath(__file__))
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not os.path.abspath(f.filename).startswith(engine + os.sep) and not f.filename.startswith("<")]
        if not frames:
            raise
        where = f"{_shown(frames[-1].filename, folder)}:{frames[-1].lineno}"
        raise SpecError(f"{where}: {exc.message}", flow=exc.flow, field=exc.field, file=where) from None


def _shown(path: str, folder: str | None = None) -> str:
    """A file as errors show it: `<folder's name>/<file>` for one of a plain folder of specs (as the folder's
    module names read), else relative to the working directory when it lies below it."""
    if folder and os.path.abspath(path).startswith(folder + os.sep):
        return os.path.join(os.path.basename(folder), os.path.relpath(path, folder))
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


def check_tables(specs: list[Spec], *, root: str | None = None, origins: dict[str, str] | None = None) -> None:
    """Refuse definitions whose outputs could overwrite another table: two specs writing one folder
    (`t` and `./t`, or `T` and `t`), an output inside another output or holding one, an output inside or
    holding a table the specs read but none writes (a source, a dimension), an output in Laminar's own
    folder (`_laminar/`: watermarks, leases, state, quarantine), flow names equal but for case. Names
    are compared as places (`layout.place_of`): relative to `root` when it is known, else as names
    relative to one root. An output naming a table the specs read is the graph, not a collision:
    whether such a table exists already is the run's check (`output.owner`).

    Raises a `SpecError` of one line naming both specs (or the spec and the table) and their files
    (`origins`: spec name -> file; else the spec's own `origin`)."""
    origins = origins or {}

    def who(spec: Spec) -> str:
        where = origins.get(spec.name) or spec.origin
        return f"{spec.kind} '{spec.name}'" + (f" ({where})" if where else "")

    named: dict[str, Spec] = {}
    for spec in specs:  # a flow's watermarks, leases and state live in folders named after it
        other = named.setdefault(spec.name.casefold(), spec)
        if other is not spec and other.name != spec.name:
            raise SpecError(f"{who(spec)} and {who(other)} have names that differ only in case: their watermarks, "
                            f"leases and state under {SYSTEM_FOLDER}/ would share folders on a disk that ignores case; "
                            "rename one", flow=spec.name, field="name")
    outputs = [(place_of(s.sink_name, root), s) for s in specs]
    written = [p for p, _ in outputs]
    system = place_of(SYSTEM_FOLDER, root)
    for place, spec in outputs:
        if system.contains(place) or place.contains(system):
            _collide(spec, f"the sink '{spec.sink}' of {who(spec)} is at {place}, "
                           f"{'inside' if system.contains(place) else 'holding'} Laminar's own folder {system} "
                           "(watermarks, leases, state and quarantine tables); give the flow another sink")
    for i, (place, spec) in enumerate(outputs):
        for other_place, other in outputs[:i]:
            if place.same(other_place):
                _collide(spec, f"{who(spec)} and {who(other)} both write the table at {place} (sinks "
                               f"'{spec.sink}' and '{other.sink}'): a second writer would replace the first's "
                               "output; give one of them another sink")
            for inner, outer, a, b in ((place, other_place, spec, other), (other_place, place, other, spec)):
                if outer.contains(inner):
                    _collide(spec, f"the sink '{a.sink}' of {who(a)} lies inside the sink '{b.sink}' of {who(b)} "
                                   f"({inner} is under {outer}): one table's folder may not hold another; give "
                                   "one of them another sink")
    for spec in specs:
        for role, table in [*(("source", t) for t in spec.sources), *(("joined table", t) for t in spec.dimension_tables)]:
            read = place_of(table, root)
            if any(read.same(p) for p in written):
                continue  # another spec's output: the graph
            for place, writer in outputs:
                if place.contains(read):
                    how = "holds"
                elif read.contains(place):
                    how = "lies inside"
                else:
                    continue
                _collide(writer, f"the sink '{writer.sink}' of {who(writer)} {how} {role} '{table}' of {who(spec)}, "
                                 f"a table no flow writes ({place} vs {read}): a run would replace or mix with its "
                                 "data; give the flow another sink")
    for spec in specs:  # a source's quarantine table is named after its folder
        seen: dict[str, str] = {}
        for table in spec.sources:
            name = os.path.basename(table.rstrip("/")).casefold()
            if name in seen and not place_of(seen[name], root).same(place_of(table, root)):
                raise SpecError(f"{who(spec)} reads sources '{seen[name]}' and '{table}', whose rejected rows would "
                                f"share one quarantine table ({SYSTEM_FOLDER}/quarantine/{name}); read one of them "
                                "through a stage", flow=spec.name, field="source")
            seen[name] = table


def check_exports(specs: list[Spec], exports: list[ExportSpec], *, origins: dict[str, str] | None = None) -> None:
    """Refuse exports that cannot be delivered as declared: a `source` that is no flow or stage of `specs` (a
    raw source table has neither the change feed nor keys Laminar knows), a source whose rows have no key for
    an export that upserts by key, a name that is another asset's (a flow, a stage, a source table) or that
    differs from another export's only in case (their records under `_laminar/exports/` would share a file),
    and two exports writing one target (one Postgres table, one Redis key prefix of one connection, or a prefix
    inside another's).

    Raises a `SpecError` of one line naming the export and its file (`origins`: name -> file; else the
    export's own `origin`)."""
    origins = origins or {}

    def who(value: Spec | ExportSpec) -> str:
        where = origins.get(value.name) or value.origin
        kind = "export" if isinstance(value, ExportSpec) else value.kind
        return f"{kind} '{value.name}'" + (f" ({where})" if where else "")

    by_name = {s.name: s for s in specs}
    produced = {place_of(s.sink_name) for s in specs}
    tables = {t for s in specs for t in _inputs(s) if not any(place_of(t).same(p) for p in produced)}
    names: dict[str, Spec | ExportSpec | None] = {s.name.casefold(): s for s in specs}
    names.update({t.casefold(): None for t in tables if t.casefold() not in names})
    targets: dict[tuple, ExportSpec] = {}
    for export in exports:
        other = names.get(export.name.casefold(), export)
        if other is None:
            raise SpecError(f"{who(export)} has the name of the source table '{export.name}', another asset; rename "
                            "the export", flow=export.name, field="name")
        if other is not export:
            raise SpecError(f"{who(export)} and {who(other)} have names that differ only in case (each is an asset, and "
                            f"an export's record under {SYSTEM_FOLDER}/exports/ is named after it); rename one",
                            flow=export.name, field="name")
        names[export.name.casefold()] = export
        source = by_name.get(export.source)
        if source is None:
            if export.source in tables or export.source.casefold() in {t.casefold() for t in tables}:
                raise SpecError(f"{who(export)} reads '{export.source}', a source table, not a flow or stage: only "
                                "Laminar's own tables have the change feed and the keys an export delivers by; export "
                                "a stage that reads it", flow=export.name, field="source")
            known = ", ".join(sorted(by_name)) or "none"
            raise SpecError(f"{who(export)} reads '{export.source}', which is no flow or stage of these definitions "
                            f"(known: {known}); fix the export's source", flow=export.name, field="source")
        problem = export.source_problem(source)
        if problem:
            raise SpecError(f"{who(export)}: {problem[1]}", flow=export.name, field=problem[0])
        place = _target_place(export)
        if place is not None:
            if place in targets:
                raise SpecError(f"{who(export)} and {who(targets[place])} both write {export.target}: each would "
                                "overwrite the other's rows; give one of them another target", flow=export.name,
                                field="table")
            targets[place] = export
    _nested_prefixes([e for e in exports if isinstance(e, RedisExport)], who)


def _nested_prefixes(exports: list[RedisExport], who) -> None:
    """Refuse a Redis key prefix below another's on one connection (`a` and `a:b`): a full resync of the first
    removes the keys under its prefix that it did not write."""
    for export in exports:
        for other in exports:
            if other is not export and other.connection == export.connection \
                    and export.prefix.startswith(other.prefix + ":"):
                raise SpecError(f"{who(export)} writes keys {export.key_prefix}:*, inside the keys {other.key_prefix}:* "
                                f"of {who(other)} on connection '{export.connection}'; give one of them a prefix that "
                                "is not inside the other's", flow=export.name, field="key_prefix")


def _target_place(export: ExportSpec) -> tuple | None:
    """What two exports may not share: the table or key space they write (None: they may share it)."""
    if isinstance(export, PostgresExport):
        if export.table_name.casefold() == "laminar_exports":
            raise SpecError(f"export '{export.name}': table '{export.table}' is the table Laminar keeps the delivered "
                            "versions in; choose another table name", flow=export.name, field="table")
        return ("postgres", export.connection, export.schema_name.casefold(), export.table_name.casefold())
    if isinstance(export, RedisExport):
        return ("redis", export.connection, export.key_prefix)
    return None


def order_exports(specs: list[Spec], exports: list[ExportSpec]) -> list[ExportSpec]:
    """Exports in the order of the specs they read (each after its source), then as found."""
    rank = {s.name: i for i, s in enumerate(specs)}
    return sorted(exports, key=lambda e: rank.get(e.source, len(rank)))


def _collide(spec: Spec, message: str) -> None:
    raise SpecError(message, flow=spec.name, field="sink")


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
    out: list[tuple[str, object]] = []
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


def order_specs(specs: list[Spec], *, origins: dict[str, str] | None = None) -> list[Spec]:
    """Specs sorted so that a stage comes before every spec that reads its sink (`./t` reads `t`); a cycle
    (a spec reading its own sink, or through others) is a `SpecError` naming each spec's sink and file."""
    sinks = [(place_of(s.sink_name), s) for s in specs]

    def writer(table: str) -> set[str]:
        read = place_of(table)
        return {s.name for place, s in sinks if place.same(read)}

    graph = {s.name: set().union(*(writer(src) for src in _inputs(s))) for s in specs}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        names = {s.name: s for s in specs}
        where = {**{s.name: s.origin for s in specs}, **(origins or {})}
        steps = [f"{n} ({where[n]}, sink '{names[n].sink}')" if where.get(n) else f"{n} (sink '{names[n].sink}')"
                 for n in exc.args[1][:-1]]
        raise SpecError(f"flows form a cycle, each reading the sink of the one before it: {' -> '.join(steps)} -> "
                        f"{exc.args[1][-1]}; a flow may not read what it writes, give one of them another sink",
                        flow=exc.args[1][0], field="source") from None
    names = {s.name: s for s in specs}
    return [names[n] for n in order]


def _inputs(spec: Spec) -> tuple[str, ...]:
    dims = spec.dimension_tables
    return tuple(spec.sources) + tuple(dims)
