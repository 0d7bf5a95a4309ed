"""`laminar demo` starts Spark's JVM before it imports Dagster: the run waits for the session."""

import subprocess
import sys


def test_the_demo_package_and_engine_import_without_dagster():
    # what `laminar demo` imports before `start_session` (cli/run_commands.py)
    code = ("import sys; from laminar_assets.demo import DEMO_JIT; from laminar_assets.engine import SparkOptions; "
            "from laminar_assets.engine.session import start_session; "
            "print(sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"imported before the JVM starts: {out.strip()[:300]}"
