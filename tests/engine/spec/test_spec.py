"""Spec validation names the flow and the field; the hash tracks what changes results."""

from __future__ import annotations

from datetime import timedelta

import pytest

from laminar_assets.engine import Agg, FlowSpec, Hopping, LatePolicy, SpecError, StageSpec, Tumbling
from laminar_assets.engine.spec.specs import DimensionJoin


def flow(**kw):
    base = dict(name="vwap", source="trades", event_time="ts", window=Tumbling("1m"), keys=("sym",),
                aggregates=(Agg.sum("qty"),))
    return FlowSpec(**{**base, **kw})


@pytest.mark.parametrize("kw,field,text", [
    (dict(aggregates=(Agg("median", "px"),)), "aggregates[0]", "unknown aggregate 'median'"),
    (dict(window=Tumbling("7m")), "window.size", "does not divide the hourly partition"),
    (dict(window=Hopping("10m", "3m")), "window.slide", "does not divide window size"),
    (dict(window=Hopping("2h", "7m")), "window.slide", "does not divide window size"),
    (dict(aggregates=(Agg.sum("qty"), Agg.sum("qty"))), "aggregates[1]", "duplicate output column 'sum_qty'"),
    (dict(aggregates=(Agg.sum("qty", name="sym"),)), "aggregates[0]", "duplicate output column 'sym'"),
    (dict(partitioning="weekly"), "partitioning", "expected 'hourly' or 'daily'"),
    (dict(refresh="sometimes"), "refresh", "expected one of auto"),
    (dict(name="bad name"), "name", "expected an identifier"),
    (dict(aggregates=()), "aggregates", "at least one aggregate"),
    (dict(aggregates=(Agg("sum"),)), "aggregates[0]", "needs a column"),
    (dict(aggregates=(Agg.approx_percentile("px", 1.5),)), "aggregates[0]", "quantile in [0, 1]"),
    (dict(window=None), "window", "expected Tumbling"),
    (dict(keys=("sym", "sym")), "keys", "duplicate group-by key"),
    (dict(max_versions_per_run=0), "max_versions_per_run", "positive integer"),
    (dict(derived={"__x": "1"}), "derived[0]", "not starting with '__'"),
    (dict(derived={"ts": "ts - INTERVAL 30 MINUTES"}), "derived.ts", "may not replace the event time"),
    (dict(derived={"window_start": "ts"}), "derived.window_start", "window column every flow adds"),
    (dict(keys=("sym", "Window_Start")), "keys[1]", "window column every flow adds and groups by"),
    (dict(derived={"d": "px * 2 AS doubled"}), "derived.d", "drop 'AS doubled'"),
    (dict(post={"r": "sum_qty / 2 as half"}), "post.r", "without a top-level alias"),
    (dict(filter="qty > 0 AS ok"), "filter", "without a top-level alias"),
    (dict(filter="sym = '\x00scan0\x00'"), "filter", "between two NUL characters"),
    (dict(aggregates=(Agg.sql("max(sym || '\x00rows\x00')", name="m"),)), "aggregates.m", "between two NUL"),
    (dict(aggregates=(Agg.sql("sum(qty) AS s", name="s"),)), "aggregates.s", "drop 'AS s'"),
    (dict(aggregates=(Agg.sum("qty", name="volume"),), post={"VOLUME": "volume * 2"}), "post.VOLUME",
     "the same as 'volume' but for case"),
    (dict(aggregates=(Agg.count(name="SYM"),)), "aggregates[0]", "the same as 'sym' but for case"),
    (dict(aggregates=(Agg.count(name="Window_Start"),)), "aggregates[0]", "the same as 'window_start'"),
    (dict(keys=("sym", "SYM")), "keys", "duplicate group-by key"),
    (dict(start="2026-11-01T10:30"), "start", "use 2026-11-01T10:00:00+00:00"),
    (dict(start="2026-11-01T10:00", partitioning="daily"), "start", "the start of a daily partition"),
    (dict(start="last week"), "start", "expected a UTC datetime"),
    (dict(start="0095-02-20"), "start", "expected a first partition from 1970 to 9998"),
    (dict(window=Tumbling("-5m")), "window.size", "expected a duration like '1m'"),
    (dict(window=Tumbling("0m")), "window.size", "expected a positive window size, found 0:00:00"),
    (dict(window=Tumbling(timedelta(minutes=-5))), "window.size", "expected a positive window size"),
    (dict(window=Tumbling("100000d")), "window.size", "expected a window size of at most 31 days"),
    (dict(window=Tumbling("99999999999d")), "window.size", "expected a duration of at most 999999999 days"),
    (dict(window=Tumbling(5)), "window.size", "expected a duration like '1m'"),
    (dict(window=Hopping("5m", "10m")), "window.slide", "does not divide window size"),
    (dict(window=Hopping("10m", "0m")), "window.slide", "expected a positive window slide"),
    (dict(window=Hopping("1d", "1s")), "window.slide", "put each event in 86400 windows; expected at most 1440"),
    (dict(late=LatePolicy("-1h")), "late.freeze_after", "expected a duration like"),
    (dict(late=LatePolicy("0h")), "late.freeze_after", "expected a positive freeze_after"),
    (dict(target_lag="99999999999d"), "target_lag", "at most 999999999 days"),
    (dict(keys=5), "keys[0]", "expected a column name, found 5"),
    (dict(aggregates=Agg.sum("qty")), None, None),
    (dict(aggregates=(Agg.sum("qty", name=5),)), "aggregates[0]", "output name 5 is not an identifier"),
    (dict(aggregates=(Agg.approx_count_distinct("sym", lg_config_k=40),)), "aggregates[0]",
     "lg_config_k between 4 and 21"),
    (dict(aggregates=(Agg.approx_top_k("sym", 5, max_items=3),)), "aggregates[0]", "fewer than the k=5"),
    (dict(derived=[("a",)]), "derived", "expected (name, expression) pairs"),
    (dict(sink=""), "sink", "expected a table name or URI"),
    (dict(event_time_bounds=(5, 6)), "event_time_bounds", "expected a datetime or an ISO string, found int"),
    (dict(filter=5), "filter", "expected a Spark SQL condition"),
])
def test_invalid_specs_name_flow_and_field(kw, field, text):
    if field is None:  # accepted
        assert flow(**kw)
        return
    with pytest.raises(SpecError) as info:
        flow(**kw)
    err = info.value
    assert err.flow == kw.get("name", "vwap") and err.field == field
    assert text in str(err)


def test_a_lone_nul_character_in_an_expression_is_fine():
    assert flow(filter="instr(sym, '\x00') = 0").filter == "instr(sym, '\x00') = 0"


def test_daily_partition_accepts_hour_windows():
    assert flow(window=Tumbling("1h"), partitioning="daily").granularity.value == "daily"


def test_hash_is_stable_and_tracks_results_not_docs():
    a = flow()
    assert a.spec_hash == flow().spec_hash
    assert flow(description="docs only").spec_hash == a.spec_hash
    assert flow(max_versions_per_run=5).spec_hash == a.spec_hash
    assert flow(start="2026-11-01").spec_hash == a.spec_hash  # where the catalog starts, not what a run computes
    assert flow(filter="qty > 0").spec_hash != a.spec_hash
    assert flow(aggregates=(Agg.sum("qty"), Agg.count())).spec_hash != a.spec_hash
    assert flow(window=Tumbling("5m")).spec_hash != a.spec_hash


def test_retractable_property():
    assert flow(aggregates=(Agg.sum("x"), Agg.avg("x"), Agg.var_samp("x"), Agg.count())).retractable
    assert not flow(aggregates=(Agg.sum("x"), Agg.count_distinct("x"))).retractable
    # the extremes retract while a row holding the extreme is left (the run recomputes the window after)
    assert flow(aggregates=(Agg.min("x"), Agg.max("x"), Agg.first("x"), Agg.last("x"), Agg.min_by("x", "y"),
                            Agg.max_by("x", "y"))).retractable


def test_stage_validation():
    with pytest.raises(SpecError, match="must include the event time"):
        StageSpec(name="s", source="t", event_time="ts", columns=("a",))
    with pytest.raises(SpecError) as info:
        StageSpec(name="s", source="t", event_time="ts", joins=(DimensionJoin("d", on=(), columns=("x",)),))
    assert info.value.field == "joins[0].on"


def test_aliases_inside_an_expression_are_fine():
    flow(derived={"d": "CASE WHEN px > 0 THEN CAST(px AS DOUBLE) END"}, filter="(SELECT 1) = 1 OR qty > 0")
