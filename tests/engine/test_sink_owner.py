"""A run writes only into a table its own flow created: a sink naming a source, a dimension or another
flow's output is refused before anything is written (correctness rule 5)."""

from __future__ import annotations

import os

import pytest

from laminar_assets import storage
from laminar_assets.engine import Agg, FlowSpec, SpecError, StageSpec, Tumbling, compile_sql

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
ROWS = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:12:00", "b", 2.0, 3)]


def flow(name: str, sink: str, source: str = "trades") -> FlowSpec:
    return FlowSpec(name=name, source=source, event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(),), sink=sink)


def files_of(lake, name: str) -> list:
    return storage.list_files(lake.path(name))


def nothing_of(lake, name: str) -> None:
    """No state, watermark, lease or outcome of flow `name` exists."""
    for folder in ("state", "checkpoints", "locks", "outcomes"):
        assert not os.path.exists(os.path.join(lake.root, "_laminar", folder, name)), folder


SQL_INTO_SYMBOLS = """CREATE MATERIALIZED VIEW s WITH (sink = 'symbols') AS
SELECT sym, TUMBLE(ts, INTERVAL '10' MINUTE), COUNT(*) AS n FROM trades GROUP BY sym, TUMBLE(ts, INTERVAL '10' MINUTE);"""


@pytest.mark.parametrize("spec", [
    flow("g", "symbols"),
    flow("g", "./symbols/"),  # the same folder spelled otherwise
    compile_sql(SQL_INTO_SYMBOLS, origin="views.sql")[0],
    StageSpec(name="st", source="trades", event_time="ts", sink="symbols"),
], ids=["python", "spelled-otherwise", "sql", "stage"])
def test_a_sink_naming_an_existing_table_no_flow_created_is_refused_before_anything_is_written(lake, engine, spec):
    lake.create("trades", ROWS)
    lake.create("symbols", [("2024-01-01 00:00:00", "a", 0.0, 0)])  # a dimension nobody's flow declares
    before, version = files_of(lake, "symbols"), lake.table("symbols").version()
    with pytest.raises(SpecError) as info:
        engine.run(spec, PART)
    text = str(info.value)
    assert f"flow '{spec.name}'" in text and "symbols" in text.lower() and "did not create" in text, text
    assert files_of(lake, "symbols") == before and lake.table("symbols").version() == version
    assert len(lake.read("symbols")) == 1
    nothing_of(lake, spec.name)


def test_a_second_flow_writing_another_flows_output_is_refused_and_the_first_keeps_running(lake, engine):
    lake.create("trades", ROWS)
    first = flow("first", "t")
    engine.run(first, PART)
    output, version = lake.read("t"), lake.table("t").version()
    with pytest.raises(SpecError, match=r"flow 'second' would write its sink .* created by flow 'first'"):
        engine.run(flow("second", "./t"), PART)
    assert lake.table("t").version() == version
    nothing_of(lake, "second")
    lake.append("trades", [("2024-01-01 00:05:00", "a", 3.0, 1)])
    assert engine.run(first, PART).mode.value != "NOOP"  # its own output: written as before
    assert sorted(lake.read("t")["count"]) == sorted([*output["count"][output["sym"] != "a"], 2])
