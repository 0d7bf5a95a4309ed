"""Bad input: quarantined and kept out, or a clear error naming table, column and version — never a Py4J trace."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import (
    Agg,
    FlowSpec,
    LaminarError,
    RowRule,
    RunFailedError,
    SchemaMismatchError,
    SourceNotFoundError,
    SpecError,
    Tumbling,
    UnsupportedTableFeatureError,
)
from tests.conftest import trades_frame

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))


def no_trace(err: Exception) -> None:
    text = str(err)
    assert "Py4J" not in text and "Traceback" not in text and "\n\tat " not in text, text


def nothing_written(lake, flow=FLOW):
    assert not os.path.exists(lake.path(flow.sink))
    mark = CheckpointStore(lake.root).load(flow.name, "2024-01-01-00:00")
    assert mark is None or mark.failed_attempt is not None or mark.failed_runs is not None


def test_null_event_times_and_keys_are_quarantined_and_excluded(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), (None, "a", 2.0, 1), ("2024-01-01 00:02:00", None, 3.0, 1)])
    r = engine.run(FLOW, PART)
    assert r.quarantined == {"event_time_missing": 1, "key_missing": 1}
    assert r.metrics["rows_quarantined"] == 2
    sink = lake.read("f")
    assert sink["count"].tolist() == [1] and sink["sum_px"].tolist() == [1.0]


def test_unparsable_string_event_times_are_quarantined(lake, engine):
    frame = pd.DataFrame({"ts": ["2024-01-01 00:01:00", "yesterday-ish", "2024-01-01 00:03:00"],
                          "sym": ["a", "a", "a"], "px": [1.0, 2.0, 3.0]})
    lake.create("trades", frame=frame)
    r = engine.run(FLOW, PART)
    assert r.quarantined == {"event_time_missing": 1}
    assert lake.read("f")["count"].tolist() == [2]


def test_missing_column_fails_before_writing(lake, engine):
    lake.create("trades", frame=trades_frame([("2024-01-01 00:01:00", "a", 1.0, 1)]).drop(columns=["px"]))
    with pytest.raises(SchemaMismatchError) as info:
        engine.run(FLOW, PART)
    err = info.value
    assert err.facts["table"] == "trades" and err.facts["column"] == "px" and err.facts["version"] == 0
    assert "does not have at version 0" in str(err)
    no_trace(err)
    assert not os.path.exists(lake.path("f"))


def test_retyped_column_fails_clearly(lake, engine):
    lake.create("trades", frame=trades_frame([("2024-01-01 00:01:00", "a", 1.0, 1)]).astype({"px": "string"}))
    with pytest.raises(SchemaMismatchError, match=r"sum\(px\) of flow 'f' needs a numeric column, found string") as info:
        engine.run(FLOW, PART)
    no_trace(info.value)


def test_filter_on_missing_column_names_it(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"),
                    aggregates=(Agg.count(),), filter="venue = 'X'")
    with pytest.raises(SchemaMismatchError) as info:
        engine.run(flow, PART)
    assert info.value.facts["column"] == "venue" and info.value.facts["field"] == "filter"
    no_trace(info.value)


@pytest.mark.parametrize("kw, field, text", [
    (dict(filter="qty + 1"), "filter", "FILTER_NOT_BOOLEAN"),
    (dict(derived={"ok": "px * 2", "bad": "px + array(1)"}), "derived.bad", "(px + array(1)) does not compile"),
    (dict(derived={"n": "px * qty", "m": "n * nosuch"}), "derived.m", "uses column 'nosuch'"),
    (dict(keys=("v",), derived={"v": "parse_json('{\"a\": 1}')"}), "keys", "cannot group rows"),
    (dict(keys=("sym",), post={"dur": "window_end - window_start"}), "post.dur", "which a Delta table cannot store"),
])
def test_a_field_that_does_not_compile_or_cannot_be_stored_is_named(lake, engine, kw, field, text):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),), **kw)
    with pytest.raises(LaminarError) as info:
        engine.run(flow, PART)
    assert info.value.facts["field"] == field and text in str(info.value), str(info.value)
    no_trace(info.value)
    nothing_written(lake)


def test_a_rule_that_is_not_a_condition_names_rule_type_and_table(lake, engine):
    """Before this check the run failed inside the pass with Spark's message about an internal
    `coalesce(..., false)` at a position in a statement the user never wrote."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),),
                    rules=(RowRule("positive", "qty + 1"),))
    with pytest.raises(SpecError, match=r"rule 'positive' \(qty \+ 1\) must be a condition.*gives bigint") as info:
        engine.run(flow, PART)
    assert info.value.facts["field"] == "rules.positive" and info.value.facts["table"] == "trades"
    no_trace(info.value)
    nothing_written(lake)


@pytest.mark.parametrize("post, problem", [
    ("volume / nosuch", "nosuch"),         # no such column anywhere
    ("volume * px", "px"),                 # a source column: gone after aggregation
    ("sum(volume)", "MISSING_GROUP_BY"),   # an aggregate over the sink's rows
    ("volume + array(1)", "ARRAY<INT>"),   # types that do not combine
])
def test_a_post_column_that_does_not_compile_names_it_and_the_sink_columns(lake, engine, post, problem):
    """Before this check these failed in the pass as a RunFailedError listing internal columns
    (`__n`, `__bad`, ...) and promising a refill that would fail the same way."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.sum("qty", name="volume"),), post={"x": post})
    with pytest.raises(SpecError) as info:
        engine.run(flow, PART)
    text = str(info.value)
    assert info.value.facts["field"] == "post.x" and problem in text, text
    assert "['sym', 'window_start', 'window_end', 'volume']" in text and "__" not in text, text
    no_trace(info.value)
    nothing_written(lake)


def test_post_columns_may_use_hidden_aggregates_window_bounds_and_earlier_post_columns(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 2.0, 3), ("2024-01-01 00:02:00", "a", 4.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    derived={"notional": "px * qty"},
                    aggregates=(Agg.sum("notional", name="n"), Agg.sum("qty", name="v"), Agg.first("px", name="o")),
                    hidden=("n",), post={"vwap": "n / v", "gap": "vwap - o",
                                         "minutes": "(unix_seconds(window_end) - unix_seconds(window_start)) / 60"})
    engine.run(flow, PART)
    row = lake.read("f").iloc[0]
    assert "n" not in lake.read("f").columns
    assert (row["vwap"], row["gap"], row["minutes"]) == (2.5, 0.5, 10.0)


@pytest.mark.parametrize("agg, why", [
    (Agg.min("m"), "min needs values that have an order"),
    (Agg.first("m"), "first needs values that have an order"),
    (Agg.min_by("px", "m"), "min_by needs values that have an order"),
    (Agg.count_distinct("m"), "count_distinct does not accept values of this type"),
])
def test_an_aggregate_over_a_column_of_an_unusable_type_names_aggregate_column_and_type(lake, engine, agg, why):
    """Before this check these failed in the pass quoting our SQL (`min(CASE WHEN ... named_struct(t, __ts,
    v, m) END)`) as a RunFailedError."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), derived={"m": "map('k', sym)"},
                    aggregates=(Agg.count(), agg))
    with pytest.raises(SpecError) as info:
        engine.run(flow, PART)
    text = str(info.value)
    assert info.value.facts["field"] == f"aggregates.{agg.name}" and why in text, text
    assert "'m' of type map<string,string>" in text and "__" not in text and "version 0" in text, text
    no_trace(info.value)
    nothing_written(lake)


def test_the_checks_accept_every_aggregate_kind_with_a_post_over_all_of_them(lake, engine):
    rows = [(f"2024-01-01 00:{i % 20:02d}:00", "a" if i % 3 else "b", 10.0 + i, i + 1) for i in range(30)]
    lake.create("trades", rows)
    aggs = (Agg.count(name="c"), Agg.sum("qty", name="s"), Agg.avg("px", name="a"), Agg.min("px", name="mn"),
            Agg.max("px", name="mx"), Agg.var_samp("px", name="vs"), Agg.stddev_samp("px", name="sd"),
            Agg.first("px", name="f"), Agg.last("px", name="l"), Agg.approx_count_distinct("qty", name="acd"),
            Agg.approx_percentile("px", 0.5, name="ap"), Agg.count_distinct("qty", name="cd"),
            Agg.min_by("px", "qty", name="mb"), Agg.max_by("px", "qty", name="xb"), Agg.top_k("px", 2, name="tk"),
            Agg.approx_top_k("sym", 2, name="atk"), Agg.sql("percentile(px, 0.5)", name="med"))
    total = " + ".join(f"coalesce({a.name}, 0)" for a in aggs if a.name not in ("tk", "atk"))
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",), aggregates=aggs,
                    hidden=("c",), post={"total": total, "sizes": "size(tk) + size(atk)", "twice": "total * 2"})
    engine.run(flow, PART)
    sink = lake.read("f")
    assert len(sink) == 4 and (sink["twice"] == 2 * sink["total"]).all() and set(sink["sizes"]) <= {2, 3, 4}


def test_a_rule_spark_casts_to_a_condition_is_accepted_as_the_pass_uses_it(lake, engine):
    """The pass keeps a row where `coalesce(check, false)` holds; Spark casts a string 'true'/'false' there
    (a review found the first version of the check refusing such rules, which ran before)."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:02:00", "a", 5.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),),
                    rules=(RowRule("pricey", "CASE WHEN px > 1 THEN 'true' ELSE 'false' END"),))
    r = engine.run(flow, PART)
    assert r.quarantined == {"pricey": 1} and lake.read("f")["count"].tolist() == [1]


def test_a_fan_in_flow_is_checked_for_case_against_its_first_source_only(lake, engine):
    """A fan-in flow reads its other sources under the first one's column names: `tb`'s `Px` is read as
    `px`, so a derived `px` replacing it is fine (it ran before; the first version of the case check
    refused it)."""
    lake.create("ta", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    lake.create("tb", frame=trades_frame([("2024-01-01 00:02:00", "a", 5.0, 1)]).rename(columns={"px": "Px"}))
    flow = FlowSpec(name="f", source=("ta", "tb"), event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    derived={"px": "px * 2"}, aggregates=(Agg.sum("px", name="s"),))
    engine.run(flow, PART)
    assert lake.read("f")["s"].tolist() == [12.0]


def test_a_derived_column_differing_from_a_source_column_only_in_case_is_refused(lake, engine):
    """Spark resolves names regardless of case: `PX` beside the source's `px` was an ambiguous
    reference deep in the pass."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.sum("PX"),),
                    derived={"PX": "px * 2"})
    with pytest.raises(SpecError, match="derived column 'PX' differs from source column 'px'") as info:
        engine.run(flow, PART)
    assert info.value.facts["field"] == "derived.PX"
    no_trace(info.value)
    nothing_written(lake)


def test_missing_source_table(lake, engine):
    with pytest.raises(SourceNotFoundError, match="source table 'trades' does not exist") as info:
        engine.run(FLOW, PART)
    no_trace(info.value)


def test_column_mapped_source_is_read_by_logical_names(lake, engine):
    # Parquet columns are named col-<uuid>; reading them by logical name would give nulls
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:01:00", "a", 1.0, 1)]),
                    configuration={"delta.columnMapping.mode": "name"})
    engine.run(FLOW, PART)
    assert lake.read("f")["count"].tolist() == [1]


def test_unsupported_reader_feature_names_feature_table_and_version(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)], cdf=False)
    with open(os.path.join(lake.path("trades"), "_delta_log", f"{1:020d}.json"), "w") as fh:
        fh.write('{"commitInfo":{"timestamp":0,"operation":"SET TBLPROPERTIES"}}\n')
        fh.write('{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["variantShredding-preview"],'
                 '"writerFeatures":["variantShredding-preview"]}}\n')
    with pytest.raises(UnsupportedTableFeatureError, match="reader feature.*variantShredding-preview") as info:
        engine.run(FLOW, PART)
    assert info.value.facts["table"] == "trades" and info.value.facts["version"] == 1
    no_trace(info.value)


def test_bad_partition_key(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    with pytest.raises(LaminarError, match="hourly partition key like '2024-01-31-13:00', found '2024-01-01'"):
        engine.run(FLOW, "2024-01-01")


def test_runtime_failure_keeps_watermark_and_refills_next_time(lake, engine):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine.run(FLOW, PART)
    lake.append("trades", [("2024-01-01 00:02:00", "a", 2.0, 1)])
    failing = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                       aggregates=(Agg.count(), Agg.sum("px")), derived={"bad": "CAST(sym AS INT)"},
                       filter="bad IS NULL OR bad > 0")
    with pytest.raises(RunFailedError) as info:
        engine.run(failing, PART)
    no_trace(info.value)
    assert "the watermark of partition(s) 2024-01-01-00:00 did not move" in str(info.value)
    assert lake.read("f")["count"].tolist() == [1]  # sink untouched
    again = engine.run(FLOW, PART)
    assert again.reason.value == "PREVIOUS_ATTEMPT_FAILED"
    assert lake.read("f")["count"].tolist() == [2]


def test_string_event_times_with_offsets_are_not_pruned_by_statistics(lake, engine):
    # As strings, '2024-01-01T10:15:00+02:00' sorts after 09:30 but is 08:15 UTC: string min/max
    # statistics must not be used to skip the file.
    frame = pd.DataFrame({"ts": ["2024-01-01T09:30:00+00:00", "2024-01-01T10:15:00+02:00", "2024-01-01T11:00:00+00:00"],
                          "sym": ["a", "a", "a"], "px": [1.0, 2.0, 3.0]})
    lake.create("trades", frame=frame)
    r = engine.run(FLOW, "2024-01-01-08:00")
    assert lake.read("f")["count"].tolist() == [1] and r.metrics["rows_read"] == 1
    lake.append("trades", frame=frame.assign(ts=["2024-01-01T10:20:00+02:00"] * 3))
    lake.delete("trades", "px = 3.0")
    r = engine.run(FLOW, "2024-01-01-08:00")
    assert sorted(lake.read("f")["count"].tolist()) == [1, 2]  # windows 08:10 (1 row) and 08:20 (3 - 1 deleted)


def test_a_schema_is_checked_once_per_process_and_again_when_it_changes(lake, spark, monkeypatch):
    """Engines are made per Dagster step: the source check is remembered by schema, across engines
    and table versions, and a changed schema is checked (and refused) again."""
    from laminar_assets.engine import Engine
    from laminar_assets.engine.run import validate

    calls = []
    real = validate.check_source
    monkeypatch.setattr(validate, "_CHECKED", {})  # earlier tests in this process checked this schema
    monkeypatch.setattr(validate, "check_source", lambda *a, **k: calls.append(a[2].version) or real(*a, **k))
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    Engine(spark, lake.root).run(FLOW, PART)
    lake.append("trades", [("2024-01-01 00:02:00", "a", 2.0, 1)])
    Engine(spark, lake.root).run(FLOW, PART)
    assert lake.read("f")["count"].tolist() == [2]
    assert calls == [0]  # version 1 has the same schema: not asked again
    retyped = trades_frame([("2024-01-01 00:03:00", "a", 3.0, 1)]).astype({"px": "string"})
    write_deltalake(lake.path("trades"), retyped, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(SchemaMismatchError, match="at version 2"):
        Engine(spark, lake.root).run(FLOW, PART)
    assert calls == [0, 2]


def test_a_fan_in_source_may_lack_a_column_the_flow_does_not_use(lake, engine):
    """`tb` has no `qty`, which the flow never reads: its rows count, with `qty` NULL (was
    UNRESOLVED_COLUMN deep in the pass). A column the flow uses must be in every source."""
    lake.create("ta", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    lake.create("tb", frame=trades_frame([("2024-01-01 00:02:00", "a", 5.0, 1)]).drop(columns=["qty"]))
    flow = FlowSpec(name="f", source=("ta", "tb"), event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.sum("px", name="s"), Agg.count(name="n")))
    engine.run(flow, PART)
    assert lake.read("f")[["s", "n"]].values.tolist() == [[6.0, 2]]
    uses_qty = FlowSpec(name="g", source=("ta", "tb"), event_time="ts", window=Tumbling("10m"),
                        aggregates=(Agg.sum("qty"),))
    with pytest.raises(SchemaMismatchError) as info:
        engine.run(uses_qty, PART)
    assert info.value.facts["table"] == "tb" and info.value.facts["column"] == "qty"
    no_trace(info.value)
