"""Contract files: loaded and validated at definition load, errors name the file and the entry."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pytest

from laminar_assets.contracts import load_contracts
from laminar_assets.contracts.guard import guard_source
from laminar_assets.definitions import CONTRACTS, build_definitions
from laminar_assets.errors import ContractError, SchemaMismatchError
from laminar_assets.flows import load_specs
from laminar_assets.pipeline.settings import LaminarSettings

GOOD = """
table: t
kind: sink
columns:
  window_start: {type: timestamp, nullable: false}
  x: {type: double}
unique_key: [window_start]
expectations:
  - {expect: between, column: x, min: 0}
"""


def write(tmp_path: pathlib.Path, text: str, name: str = "t.yaml") -> pathlib.Path:
    (tmp_path / name).write_text(text)
    return tmp_path


def test_project_contracts_load_against_the_specs():
    defs = build_definitions(load_specs(), LaminarSettings())
    names = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert names == {"watermark_lag", "contract", "equivalence"}
    contracts = load_contracts(CONTRACTS)
    assert set(contracts) >= {"raw_trades", "symbols", "normalized_trades", "vwap_1m", "ohlc_5m", "positions_1h",
                              "sector_stats_1h", "large_trades"}
    assert contracts["vwap_1m"].unique_key == ["window_start", "window_end", "symbol"]


@pytest.mark.parametrize("text,entry,message", [
    ("table: t\nkind: sink\ncolumns: {a: {type: varchar}}\n", "columns.a.type", "Input should be"),
    ("table: t\nkind: sink\ncolumns: {a: {type: bigint}}\nexpectations:\n  - {expect: be_nice, column: a}\n",
     "expectations.0.expect", "Input should be"),
    ("table: t\nkind: sink\ncolumns: {a: {type: bigint}}\nexpectations:\n  - {expect: between, column: b, min: 1}\n",
     "expectations.0", "names column 'b'"),
    ("table: t\nkind: sink\ncolumns: {a: {type: bigint}}\nexpectations:\n  - {expect: between, column: a}\n",
     "expectations.0", "needs 'min' and/or 'max'"),
    ("table: t\nkind: sink\ncolumns: {a: {type: bigint}}\nunique_key: [z]\n", "unique_key", "undeclared column 'z'"),
    ("table: t\nkind: sink\ncolumns: {a: {type: bigint}}\ncolour: blue\n", "colour", "Extra inputs"),
    ("table: t\nkind: source\ncolumns: {a: {type: bigint}}\nquarantine: {rules: {key_missing: 'a > 0'}}\n",
     "quarantine.rules", "other than event_time_missing"),
    ("table: t\nkind: source\ncolumns: {a: {type: bigint}}\nquarantine:\n  event_time: {column: ts, "
     "not_before: '2000-01-01T00:00:00Z', before: '2100-01-01T00:00:00Z'}\n",
     "quarantine.event_time.column", "undeclared column 'ts'"),
    ("table: t\nkind: source\ncolumns: {a: {type: bigint}}\nquarantine:\n  event_time: {column: a, "
     "not_before: '2100-01-01T00:00:00Z', before: '2000-01-01T00:00:00Z'}\n",
     "quarantine.event_time", "not_before < before"),
])
def test_bad_contracts_name_file_and_entry(tmp_path, text, entry, message):
    with pytest.raises(ContractError) as info:
        load_contracts(write(tmp_path, text))
    assert info.value.facts["file"].endswith("t.yaml") and info.value.facts["entry"] == entry
    assert message in str(info.value) and "t.yaml" in str(info.value)


def test_malformed_yaml_and_column_the_table_lacks(tmp_path):
    with pytest.raises(ContractError, match="t.yaml is not valid YAML"):
        load_contracts(write(tmp_path, "table: [unclosed"))
    folder = write(tmp_path, GOOD)
    with pytest.raises(ContractError, match=r"entry 'columns.x': table 't' has no column 'x'"):
        load_contracts(folder, {"t": ["window_start", "y"]})
    assert load_contracts(folder, {"t": ["window_start", "x"]})["t"].rules()[0].expect == "not_null"


def test_schema_guard():
    contract = load_contracts(CONTRACTS)["raw_trades"]
    fields = {n: pa.int64() if c.type == "bigint" else pa.float64() if c.type == "double" else
              pa.timestamp("us", tz="UTC") if c.type == "timestamp" else pa.string()
              for n, c in contract.columns.items()}
    schema = pa.schema(list(fields.items()))
    assert guard_source(contract, schema, 3, {"*"}).added_columns == ()
    wider = schema.append(pa.field("fee", pa.float64(), nullable=True))
    assert guard_source(contract, wider, 4, {"*"}).added_columns == ("fee",)
    retyped = pa.schema([(n, pa.string() if n == "price" else t) for n, t in fields.items()])
    with pytest.raises(SchemaMismatchError, match=r"column 'price' at version 5: expected double \(contract\), found string"):
        guard_source(contract, retyped, 5, {"*"})
    missing = pa.schema([(n, t) for n, t in fields.items() if n != "quantity"])
    with pytest.raises(SchemaMismatchError, match="has no column 'quantity'"):
        guard_source(contract, missing, 6, {"*"})
    assert guard_source(contract, missing, 6, {"event_time", "price"}).table == "raw_trades"  # unused: fine


def test_source_rules_are_carried_into_the_specs_that_read_the_source():
    from laminar_assets.contracts import with_contract_rules

    stage = next(s for s in load_specs() if s.name == "normalized_trades")
    assert {(r.name, r.source) for r in stage.rules} == {
        ("positive_quantity", "raw_trades"), ("positive_price", "raw_trades"), ("known_side", "raw_trades")}
    assert stage.bounds is not None and stage.bounds.start.year == 2000
    assert with_contract_rules(stage, load_contracts(CONTRACTS)) is stage  # applying twice changes nothing
    flow = next(s for s in load_specs() if s.name == "vwap_1m")
    assert flow.rules == () and flow.event_time_bounds is None  # normalized_trades declares no rules


@pytest.mark.parametrize("sink", ["symbols", "./Symbols"])
def test_a_sink_named_like_a_source_with_a_contract_is_refused_naming_flow_table_and_contract(sink):
    """A flow folder whose specs do not read `symbols` cannot tell from the specs that it is a source; its
    contract can. Before: `contract symbols.yaml: ... table 'symbols' has no column 'sector'`."""
    import dataclasses

    from laminar_assets.definitions import specs_with_contracts
    from laminar_assets.errors import SpecError

    vwap = next(s for s in load_specs() if s.name == "vwap_1m")
    with pytest.raises(SpecError) as info:
        specs_with_contracts([dataclasses.replace(vwap, sink=sink)])
    assert f"the sink '{sink}' of flow 'vwap_1m'" in info.value.message
    assert "is the source table 'symbols' (its contract symbols.yaml says kind: source)" in info.value.message
    assert info.value.facts["flow"] == "vwap_1m" and info.value.facts["field"] == "sink"
