"""A sink or state table whose log was damaged by hand (an entry cut short or edited) is refused with one error that
names the table and the damaged file, before anything is written: not deltalake's bare "Invalid JSON" without
either."""

from __future__ import annotations

import glob
import os

import pytest

from laminar_assets import storage
from laminar_assets.engine import Agg, Engine, FlowSpec, Tumbling
from laminar_assets.errors import SourceError
from tests.conftest import Lake

FLOW = FlowSpec(name="damaged", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("qty")))
PART = "2024-01-01-00:00"


def _damage_newest_commit(table_uri: str) -> str:
    """Cut the newest commit file of the table at `table_uri` short, mid-line; its URI."""
    log = storage.join(table_uri, "_delta_log")
    newest = max(name for name, _tag in storage.list_tagged(log) if name.endswith(".json"))
    entry = storage.join(log, newest)
    storage.write(entry, (storage.read(entry) or b"")[:-40])
    return entry


def _versions(table_uri: str) -> list[str]:
    return sorted(n for n, _tag in storage.list_tagged(storage.join(table_uri, "_delta_log")) if n.endswith(".json"))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_damaged_sink_log_is_refused_naming_the_table_and_the_file(spark, lake, s3_lake, where):
    on: Lake = lake if where == "local" else s3_lake
    on.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine = Engine(spark, on.root)
    engine.run_many(FLOW, [PART])
    sink = engine.layout.sink_uri(FLOW)
    entry = _damage_newest_commit(sink)
    on.append("trades", [("2024-01-01 00:02:00", "a", 2.0, 2)])
    state = [d for d in glob.glob(os.path.join(on.root, "_laminar", "state", FLOW.name, "*"))] if where == "local" else []
    before = {sink: _versions(sink), **{s: _versions(s) for s in state}}
    with pytest.raises(SourceError) as caught:
        engine.run_many(FLOW, [PART])
    message = str(caught.value)
    assert "the Delta log of 'damaged' is damaged" in message and entry.rsplit("/", 1)[-1] in message, message
    assert "Traceback" not in message and "\n" not in message.strip()
    assert {sink: _versions(sink), **{s: _versions(s) for s in state}} == before  # nothing written


def test_the_integrity_check_reports_a_damaged_log_and_checks_the_other_tables(spark, lake):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine = Engine(spark, lake.root)
    engine.run_many(FLOW, [PART])
    entry = _damage_newest_commit(engine.layout.sink_uri(FLOW))
    found = engine.integrity(FLOW)  # `laminar check` and the asset checks: one line per table, none aborts it
    broken = [t for t in found if not t.ok]
    assert [t.table for t in broken] == [FLOW.sink_name]
    assert "is damaged" in broken[0].describe() and entry.rsplit("/", 1)[-1] in broken[0].describe()
    assert broken[0].to_json()["damage"] == broken[0].damage
    assert any(t.ok and t.version is not None for t in found)  # the state table, checked
