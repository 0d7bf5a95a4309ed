"""The test tiers (docs/testing.md) keep naming real tests: `make test-quick` runs tests/conftest.py's
QUICK list, and a renamed or removed test must not silently leave an area without a representative."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import QUICK, SHARED_SERVERS

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.process


def test_every_quick_test_exists_and_is_collected():
    files = sorted({q.split("::")[0] for q in QUICK})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *files], cwd=REPO, capture_output=True, text=True, timeout=300)
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    missing = [q for q in QUICK if q not in collected]
    assert not missing, f"QUICK names tests that are not collected (renamed or removed?): {missing}"
    areas = {q.split("/")[1] for q in QUICK}
    assert {"engine", "orchestration", "contracts", "cli", "deploy"} <= areas, areas


def test_every_file_using_a_shared_server_is_in_its_group():
    """A file that takes one of `SHARED_SERVERS`' fixtures but is missing from its group would start a
    server of its own in another test process; a listed file that no longer uses it only wastes a unit."""
    for fixture, listed in SHARED_SERVERS.items():
        using = set()
        for path in (REPO / "tests").rglob("test_*.py"):
            tree = ast.parse(path.read_text())
            if any(fixture in {a.arg for a in node.args.args} for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef)):
                using.add(str(path.relative_to(REPO)))
        assert using == set(listed), f"{fixture}: used by {sorted(using)}, grouped {sorted(listed)}"
