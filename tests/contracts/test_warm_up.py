"""Great Expectations is loaded in the background while an asset computes (a launched run is a new
process, and the import takes seconds on the path to a blocking contract check)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

SCRIPT = """
import sys
from laminar_assets.contracts.expectations import warm_up
assert "great_expectations" not in sys.modules
thread = warm_up()
thread.join(300)
assert not thread.is_alive() and "great_expectations" in sys.modules
assert warm_up() is None  # once per process
print("ok")
"""


def test_warm_up_loads_great_expectations_once_in_the_background():
    # a fresh interpreter, like a launched run: nothing has imported great_expectations yet
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
