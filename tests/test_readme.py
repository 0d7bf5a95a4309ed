"""The README's code and commands keep working: its flow example builds, `dagster asset materialize`
works from the repo root, and `dagster dev` serves the definitions."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from laminar_assets.engine import FlowSpec
from tests.deploy.processes import free_port

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_readme_flow_example_builds_a_valid_spec():
    [block] = [b for b in python_blocks() if "FlowSpec(" in b]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    spec = namespace["notional_by_venue_15m"]
    assert isinstance(spec, FlowSpec) and spec.shape.size.total_seconds() == 900
    from laminar_assets.flows import load_specs

    stage = {s.name: s for s in load_specs()}["normalized_trades"]
    assert spec.sources == (stage.name,)  # the example reads the shared stage


def test_readme_commands_exist():
    text = (REPO / "README.md").read_text()
    for target in ("make demo", "make test", "make ui", "make test-fast"):
        assert target in text
        assert re.search(rf"^{target.split()[1]}:", (REPO / "Makefile").read_text(), re.M), target
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.spark
def test_dagster_asset_materialize_from_repo_root(tmp_path):
    from tests.conftest import Lake
    from tests.dagster.pipeline import BASE, create_sources

    lake = Lake(str(tmp_path / "lake"))
    create_sources(lake, BASE)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "LAMINAR_ROOT": lake.root}
    assert "dagster asset materialize -m laminar_assets.definitions" in (REPO / "README.md").read_text()
    proc = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m", "laminar_assets.definitions",
                           "--select", "normalized_trades",
                           "--partition", "2024-01-02-09:00"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(lake.read("normalized_trades")["trade_id"]) == [1, 2, 3]


def test_dagster_dev_serves_the_definitions(tmp_path):
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        body = ""
        while time.time() < deadline:
            try:
                query = b'{"query": "{ assetNodes { assetKey { path } } }"}'
                req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=query,
                                             headers={"Content-Type": "application/json"})
                body = urllib.request.urlopen(req, timeout=5).read().decode()
                if "vwap_1m" in body:
                    break
            except OSError:
                pass
            time.sleep(2)
        assert "vwap_1m" in body and "normalized_trades" in body, body[:500]
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # e.g. SIGTERM ignored (an inherited ignored SIGINT): not left behind
            os.killpg(proc.pid, 9)
            proc.wait(30)
            raise
