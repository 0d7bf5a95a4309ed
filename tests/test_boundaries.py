"""Architecture rules that a test enforces: the engine and checkpoints never import Dagster."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1] / "laminar_assets"


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_engine_and_checkpoints_do_not_import_dagster():
    offenders = [
        str(p.relative_to(ROOT)) for pkg in ("engine", "checkpoints") for p in (ROOT / pkg).rglob("*.py")
        if {"dagster", "dagster_pyspark"} & _imports(p)
    ]
    assert not offenders, offenders


def test_importing_the_engine_loads_no_dagster():
    code = ("import sys, laminar_assets.engine, laminar_assets.checkpoints; "
            "print(any(m.startswith('dagster') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


ENGINE = ROOT / "engine"
# The engine's packages (and top-level modules) from the bottom up: a module may import from its own
# package and from packages on a lower level, never from one on its level or above.
LEVELS = {"windows": 0, "spec": 1, "aggregates": 2, "sql": 2, "delta": 3, "spark": 4, "output": 5, "quarantine": 6,
          "catalog": 6, "run": 7, "flow": 8, "stage": 8, "export": 9, "report": 10, "executor": 11, "registry": 11}


def _engine_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["laminar_assets", "engine"] and len(parts) > 2 else None


def _absolute_imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports from, relative imports resolved."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(ROOT.parent).parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


def test_the_engines_packages_import_only_downward():
    upward = []
    for path in ENGINE.rglob("*.py"):
        if path.parent == ENGINE and path.name == "__init__.py":
            continue  # the facade exports from every package
        mine = path.relative_to(ENGINE).parts[0].removesuffix(".py")
        for module in _absolute_imports(path):
            theirs = _engine_part(module)
            if theirs in LEVELS and theirs != mine and LEVELS[theirs] >= LEVELS[mine]:
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not upward, upward
    assert {p.name.removesuffix(".py") for p in ENGINE.iterdir() if p.name != "__init__.py" and p.suffix in ("", ".py")
            and not p.name.startswith("__")} == set(LEVELS)  # a new package gets a level


def test_other_layers_use_the_engines_public_api():
    """Outside the engine, only `laminar_assets.engine` and its packages' `__init__` are imported."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if ENGINE in path.parents:
            continue
        for module in _absolute_imports(path):
            parts = module.split(".")
            if parts[:2] == ["laminar_assets", "engine"] and len(parts) > 3:
                if (ENGINE / parts[2] / "__init__.py").exists() and not (ENGINE / parts[2] / f"{parts[3]}.py").exists():
                    continue  # a name from a package's __init__
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
            elif parts[:2] == ["laminar_assets", "engine"] and len(parts) == 3 and (ENGINE / f"{parts[2]}.py").exists():
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, offenders


def test_the_pipeline_package_does_not_import_dagster():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*.py") if "dagster" in _imports(p)]
    assert not offenders, offenders


def _private_dagster_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    found += [node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0]
    return [name for name in found if name.startswith("dagster._") or name.startswith("dagster_pyspark._")]


def test_dagsters_private_modules_are_imported_only_in_the_internals_room():
    """A Dagster upgrade that moves a private name breaks `orchestration/internals/` only (docs/ARCHITECTURE.md)."""
    room = ROOT / "orchestration" / "internals"
    offenders = {str(p.relative_to(ROOT)): names for p in ROOT.rglob("*.py")
                 if room not in p.parents and (names := _private_dagster_imports(p))}
    assert not offenders, f"import these through laminar_assets/orchestration/internals/: {offenders}"
    assert _private_dagster_imports(room / "private_names.py"), "the check itself must see a private import"


def _kind_tests(path: pathlib.Path | str) -> list[str]:
    """`isinstance(x, FlowSpec)`-style tests of a spec's class in a module (or source text): the classes tested."""
    found = []
    for node in ast.walk(ast.parse(path.read_text() if isinstance(path, pathlib.Path) else path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            found += [c.id for c in classes if isinstance(c, ast.Name) and c.id in ("FlowSpec", "StageSpec")]
    return found


def test_the_dagster_layer_asks_a_specs_kind_instead_of_testing_its_class():
    """What differs between a flow and a stage is the spec's to say (`BaseSpec`'s class attributes and methods):
    orchestration/, pipeline/ and cli/ ask it, so a new kind of spec touches none of them."""
    offenders = {str(p.relative_to(ROOT)): names for layer in ("orchestration", "pipeline", "cli")
                 for p in (ROOT / layer).rglob("*.py") if (names := _kind_tests(p))}
    assert not offenders, f"ask the spec (a BaseSpec attribute or method) instead: {offenders}"
    assert _kind_tests("if isinstance(s, (FlowSpec, int)) or isinstance(s, StageSpec): pass") == \
        ["FlowSpec", "StageSpec"]  # the check sees what it looks for


def test_the_engine_asks_a_specs_kind_instead_of_testing_its_class():
    """The engine too (#64): the executor, planner, checks and reports ask the spec (`aggregation()`,
    `refilled_share`, `row_key`, ...), so the flow/stage decisions live in the spec classes alone."""
    offenders = {str(p.relative_to(ROOT)): names for p in ENGINE.rglob("*.py") if (names := _kind_tests(p))}
    assert not offenders, f"ask the spec (a BaseSpec attribute or method) instead: {offenders}"
