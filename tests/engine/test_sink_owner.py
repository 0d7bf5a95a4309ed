"""A run writes only into a table its own flow created: a sink naming a source, a dimension or another
flow's output is refused before anything is written (correctness rule 5)."""

from __future__ import annotations

import os

import pytest
from deltalake import write_deltalake

from laminar_assets import storage
from laminar_assets.engine import Agg, FlowSpec, SpecError, StageSpec, Tumbling, compile_sql
from laminar_assets.engine.delta import open_delta
from tests.conftest import trades_frame

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
    for folder in ("state", "watermarks", "locks", "outcomes"):
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


def test_every_commit_laminar_makes_to_its_tables_names_the_flow(lake, engine):
    """The table's creation and a schema evolution are commits too: on main they named no flow (like a
    commit someone else made), so a table's history could not tell Laminar's housekeeping from another
    writer's commit."""
    lake.create("trades", ROWS)
    counts, clean = flow("counts", "counts"), StageSpec(name="clean", source="trades", event_time="ts")
    engine.run(counts, PART)
    engine.run(clean, PART)
    gained = trades_frame([("2024-01-01 00:05:00", "a", 3.0, 1)]).assign(note="n")
    write_deltalake(lake.path("trades"), gained, mode="append", schema_mode="merge")
    engine.run(clean, PART)  # the output gains the column: a schema commit, then the run's
    state = os.path.join(lake.root, "_laminar", "state", "counts")
    tables = {"counts": ["counts", *[os.path.join(state, t) for t in os.listdir(state)]], "clean": ["clean"]}
    for name, uris in tables.items():
        for uri in uris:
            history = open_delta(lake.path(uri)).history()
            assert [c.get("laminar.flow") for c in history] == [name] * len(history), (uri, history)
    assert {c["operation"] for c in open_delta(lake.path("clean")).history()} >= {"CREATE TABLE", "WRITE"}
