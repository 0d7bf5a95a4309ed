"""Definitions whose tables collide fail when they are loaded, in one line naming both specs and their
files, before anything runs: two outputs in one folder, an output inside another table or holding one,
an output in Laminar's own `_laminar/` folder (`registry.check_tables`). No Spark."""

from __future__ import annotations

import os

import pytest

from laminar_assets.engine import Agg, FlowSpec, SpecError, StageSpec, Tumbling, check_tables, collect_specs

STAGE = "st = StageSpec(name='st', source='raw/trades', event_time='ts', joins=[DimensionJoin('dims', on='k', columns=['c'])])\n"


def flow_py(name: str, sink: str, source: str = "st") -> str:
    return (f"{name} = FlowSpec(name={name!r}, source={source!r}, event_time='ts', window=Tumbling('1m'), "
            f"aggregates=[Agg.count()], sink={sink!r})\n")


def folder_of(tmp_path, files: dict[str, str]) -> str:
    folder = tmp_path / "flows"
    folder.mkdir()
    header = "from laminar_assets.engine import Agg, DimensionJoin, FlowSpec, StageSpec, Tumbling\n"
    for name, text in files.items():
        (folder / name).write_text(text if name.endswith(".sql") else header + text)
    return str(folder)


def refused(folder: str) -> str:
    with pytest.raises(SpecError) as info:
        collect_specs(folder)
    text = str(info.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("first, second", [("t", "./t"), ("t", "t/"), ("t", "a/../t"), ("t", "T")],
                         ids=["dot", "slash", "dotdot", "case"])
def test_two_flows_writing_one_folder_fail_at_load_naming_both_and_their_files(tmp_path, first, second):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", first), "two.py": flow_py("f2", second)})
    text = refused(folder)
    assert "flow 'f2' (flows/two.py) and flow 'f1' (flows/one.py) both write the table at <root>/" in text, text
    assert f"'{first}'" in text and f"'{second}'" in text


def test_a_sql_view_and_a_python_flow_writing_one_table_fail_at_load(tmp_path):
    sql = ("CREATE MATERIALIZED VIEW v WITH (sink = './Out/') AS SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n\n"
           "FROM st GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE);\n")
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", "out"), "views.sql": "\n" + sql})
    text = refused(folder)
    assert "flow 'v' (" in text and "views.sql:2)" in text and "flow 'f1' (flows/one.py)" in text, text


@pytest.mark.parametrize("sink, inner, outer", [
    ("f1_out/part", "f1_out/part", "f1_out"),  # inside another flow's sink
    ("st/extra", "st/extra", "st"),  # inside a stage's output, which flows read
])
def test_a_sink_inside_another_sink_fails_at_load(tmp_path, sink, inner, outer):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", "f1_out"), "two.py": flow_py("f2", sink)})
    text = refused(folder)
    assert f"the sink '{inner}' of " in text and f"lies inside the sink '{outer}' of " in text, text


@pytest.mark.parametrize("sink, how, role, table", [
    ("raw/trades/agg", "lies inside", "source", "raw/trades"),
    ("raw", "holds", "source", "raw/trades"),
    ("dims/x", "lies inside", "joined table", "dims"),
])
def test_a_sink_inside_or_holding_a_table_the_flows_read_fails_at_load(tmp_path, sink, how, role, table):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", sink)})
    text = refused(folder)
    assert f"the sink '{sink}' of flow 'f1' (flows/one.py) {how} {role} '{table}' of stage 'st' (flows/stage.py)" in text


@pytest.mark.parametrize("sink", ["_laminar/quarantine/raw", "./_Laminar/state/x", ".", "./"])
def test_a_sink_in_or_holding_laminars_own_folder_fails_at_load(tmp_path, sink):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", sink)})
    text = refused(folder)
    assert "flow 'f1' (flows/one.py)" in text and "Laminar's own folder <root>/_laminar" in text, text


def test_a_flow_reading_its_own_sink_is_a_cycle_naming_the_sink_and_file(tmp_path):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", "./st_again", source="st_again")})
    assert "flows form a cycle, each reading the sink of the one before it: f1 (flows/one.py, sink './st_again')" \
        in refused(folder)


def test_a_flow_may_read_another_flows_output_spelled_otherwise(tmp_path):
    folder = folder_of(tmp_path, {"stage.py": STAGE, "one.py": flow_py("f1", "./out/"), "two.py": flow_py("f2", "o2", "out")})
    assert [s.name for s in collect_specs(folder)] == ["st", "f1", "f2"]  # f1 before the flow reading its output


def test_two_sources_sharing_a_quarantine_table_fail_at_load(tmp_path):
    folder = folder_of(tmp_path, {"one.py": flow_py("f1", "out", source=["eu/trades", "us/Trades"])})
    assert "reads sources 'eu/trades' and 'us/Trades', whose rejected rows would share one quarantine table" \
        in refused(folder)


def flow(name: str, sink: str, source: str = "trades") -> FlowSpec:
    return FlowSpec(name=name, source=source, event_time="ts", window=Tumbling("1m"), aggregates=[Agg.count()], sink=sink)


def test_with_the_root_known_absolute_and_relative_names_of_one_folder_collide(tmp_path):
    root = str(tmp_path / "lake")
    specs = [flow("f1", "out"), flow("f2", os.path.join(root, "out"))]
    check_tables(specs)  # without the root, an absolute path and a relative name cannot be compared
    with pytest.raises(SpecError, match=r"flow 'f2' and flow 'f1' both write the table at .*lake/out"):
        check_tables(specs, root=root)
    with pytest.raises(SpecError, match="Laminar's own folder"):
        check_tables([flow("f1", os.path.join(root, "_laminar", "x"))], root=root)


def test_object_store_keys_differing_in_case_are_two_tables_but_relative_names_are_not():
    check_tables([flow("f1", "s3://b/lake/T"), flow("f2", "s3://b/lake/t")], root="s3://b/lake")
    with pytest.raises(SpecError, match="both write"):
        check_tables([flow("f1", "s3a://b/lake/t/"), flow("f2", "s3://b/lake/./t")], root="s3://b/lake")
    with pytest.raises(SpecError, match="both write"):
        check_tables([flow("f1", "T"), flow("f2", "t")])


def test_a_stage_and_flows_of_distinct_tables_load(tmp_path):
    specs = [StageSpec(name="st", source="raw", event_time="ts"), flow("f1", "a", "st"), flow("f2", "a_b", "st"),
             flow("f3", "ab", "./st/")]
    check_tables(specs, root=str(tmp_path))


def test_an_invalid_python_spec_names_its_file_and_line(tmp_path):
    folder = folder_of(tmp_path, {"one.py": "\n" + flow_py("f1", "x").replace("Tumbling('1m')", "Tumbling('-5m')")})
    text = refused(folder)
    assert text.startswith("flows/one.py:3: FlowSpec 'f1': expected a duration like '1m'") and "field=window.size" in text


def test_flow_names_differing_only_in_case_fail_at_load():
    with pytest.raises(SpecError, match="flow 'Vwap' and flow 'vwap' have names that differ only in case"):
        check_tables([flow("vwap", "a"), flow("Vwap", "b")])
