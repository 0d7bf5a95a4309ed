"""A scratch `dg` project of a team that adds Laminar beside its own assets (tests/orchestration/test_component.py).

Its own asset `busiest_symbol` is downstream of Laminar's `trades_1m`, hourly like it, and materialized by
Declarative Automation (`AutomationCondition.eager()` over its latest two hours), not by Laminar's sensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd

BIN = Path(sys.executable).parent

PYPROJECT = """[project]
name = "teamproj"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["laminar"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "teamproj"

[tool.dg.cli]
suppress_warnings = ["project_and_activated_venv_mismatch"]
"""

DEFINITIONS = """from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

# The team's own asset: the busiest symbol of each hour of Laminar's per-minute rollup.
DOWNSTREAM = '''from datetime import timedelta

import dagster as dg
from deltalake import DeltaTable

HOURS = dg.HourlyPartitionsDefinition(start_date="{start}", end_offset=1)  # the flow's own partitions
# eager() looks at the latest hour only; the team also wants the hour before it, so a run that straddles the
# top of the hour still reports the hour its data landed in.
EAGER = dg.AutomationCondition.eager().replace(
    "in_latest_time_window", dg.AutomationCondition.in_latest_time_window(timedelta(hours=2)))


@dg.asset(deps=["trades_1m"], partitions_def=HOURS, automation_condition=EAGER, group_name="reports")
def busiest_symbol(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    window = context.partition_time_window
    rows = DeltaTable("{lake}/trades_1m").to_pandas()
    rows = rows[(rows["window_start"] >= window.start) & (rows["window_start"] < window.end)]
    volume = rows.groupby("symbol")["volume"].sum().sort_values(ascending=False)
    return dg.MaterializeResult(metadata={{"symbol": str(volume.index[0]) if len(volume) else "",
                                          "volume": int(volume.iloc[0]) if len(volume) else 0}})


# Declarative Automation needs a sensor that is on: Dagster's default one starts toggled off.
reports_automation = dg.AutomationConditionSensorDefinition(
    "reports_automation", target=dg.AssetSelection.groups("reports"), minimum_interval_seconds=5,
    default_status=dg.DefaultSensorStatus.RUNNING)
'''


def make_project(folder: Path, lake: str, start: datetime) -> dict[str, str]:
    """The project's files, and the environment its `dg` commands run with."""
    (folder / "src" / "teamproj" / "defs").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "src" / "teamproj" / "__init__.py").write_text("")
    (folder / "src" / "teamproj" / "defs" / "__init__.py").write_text("")
    (folder / "src" / "teamproj" / "definitions.py").write_text(DEFINITIONS)
    (folder / "src" / "teamproj" / "defs" / "reports.py").write_text(
        DOWNSTREAM.format(start=f"{start:%Y-%m-%d-%H:%M}", lake=lake))
    home = folder / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "LAMINAR_"))}
    # the team's runs start Spark JVMs of their own; C1 only, as every test JVM (tests/conftest.py), through
    # the setting a team would use (SparkAttributes.jit falls back to LAMINAR_SPARK_JIT)
    env["LAMINAR_SPARK_JIT"] = os.environ.get("LAMINAR_SPARK_JIT", "quick")
    return {**env, "PYTHONPATH": str(folder / "src"), "DAGSTER_HOME": str(home)}


def dg(folder: Path, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dg"), *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)


def listed(folder: Path, env: dict) -> dict:
    """`dg list defs --json`: the project's definitions as dg sees them."""
    proc = dg(folder, env, "list", "defs", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def trades(start: datetime, n: int, first_id: int, seed: int) -> pd.DataFrame:
    """`n` trades of three symbols with event times spread over the hour from `start`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    times = [start + timedelta(seconds=float(s)) for s in np.sort(rng.random(n) * 3000)]
    return pd.DataFrame({
        "trade_id": np.arange(first_id, first_id + n, dtype="int64"),
        "event_time": pd.to_datetime(times, utc=True).astype("datetime64[us, UTC]"),
        "symbol": rng.choice(["AAPL", "MSFT", "XOM"], n),
        "price": np.round(rng.uniform(100, 200, n), 2),
        "quantity": rng.integers(1, 500, n).astype("int64"),
    })


def expected_minutes(rows: pd.DataFrame) -> pd.DataFrame:
    """trades_1m recomputed in pandas: volume and trades per symbol and minute."""
    rows = rows.assign(window_start=rows["event_time"].dt.floor("min"))
    out = rows.groupby(["window_start", "symbol"]).agg(volume=("quantity", "sum"), trades=("trade_id", "count"))
    return out.reset_index().sort_values(["window_start", "symbol"]).reset_index(drop=True)
