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
    code = "import sys, laminar_assets.engine, laminar_assets.checkpoints; print(any(m.startswith('dagster') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
