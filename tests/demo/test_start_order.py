"""`laminar demo` starts Spark's JVM before it imports Dagster: the first run waits for the session."""

import inspect
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process


def test_the_cli_and_what_the_demo_imports_before_its_jvm_starts_load_no_dagster():
    # the CLI's modules, then what `demo` imports before `start_session` (cli/run_commands.py)
    code = ("import sys; import laminar_assets.cli; from laminar_assets.demo import DEMO_JIT; "
            "from laminar_assets.engine import SparkOptions; from laminar_assets.engine.spark.session import start_session; "
            "print(sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"imported before the JVM starts: {out.strip()[:300]}"


def test_the_demo_command_starts_spark_before_it_imports_the_dagster_side():
    from laminar_assets.cli.run_commands import demo

    source = inspect.getsource(demo)
    assert source.index("start_session(") < source.index("laminar_assets.demo.run import")
