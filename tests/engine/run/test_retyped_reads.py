"""A column a spec's expressions read, retyped to another family (price double -> string): the run is
refused before it reads or writes anything, naming the column, both types and the version, instead of
failing inside Spark's cast on every run; restoring the type heals (issue 66). The comparison itself
needs no Spark: those tests run on real Delta tables without it."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import Watermark
from laminar_assets.engine import Agg, FlowSpec, Mode, Reason, RowRule, SchemaMismatchError, StageSpec, Tumbling
from laminar_assets.engine.delta.layout import Layout
from laminar_assets.engine.delta.schema_history import type_family
from laminar_assets.engine.run.inputs import gather
from laminar_assets.engine.run.retyped_reads import refuse_retyped_reads
from laminar_assets.engine.run.validate import CheckedSource
from laminar_assets.engine.spec.reads import columns_read, expression_columns
from laminar_assets.errors import RunFailedError
from tests.conftest import trades_frame
from tests.reference import assert_frames_match, full_recompute

PART, NEXT = "2024-01-01-00:00", "2024-01-01-01:00"
CLEAN = StageSpec(name="clean", source="trades", event_time="ts", rules=(RowRule("positive_px", "px > 0"),))
NOTIONAL = FlowSpec(name="notional", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    derived={"notional": "px * qty"}, aggregates=(Agg.count(), Agg.sum("notional")))


def retype(lake, rows, to: str) -> None:
    """The producer rewrites `trades` with `px` of dtype `to` (an overwrite that changes the schema)."""
    write_deltalake(lake.path("trades"), trades_frame(rows).astype({"px": to}), mode="overwrite",
                    schema_mode="overwrite")


def written(lake) -> dict[str, tuple[int, int]]:
    """Every file of the lake but the source's and the watermarks' (which count failed runs), with its
    size and time of change: what a run wrote (outputs, state, quarantine, sweep progress, outcomes)."""
    out = {}
    for folder, _dirs, files in os.walk(lake.root):
        rel = os.path.relpath(folder, lake.root)
        if rel.split(os.sep)[0] == "trades" or rel.startswith(os.path.join("_laminar", "watermarks")):
            continue
        for f in files:
            st = os.stat(os.path.join(folder, f))
            out[os.path.join(rel, f)] = (st.st_size, st.st_mtime_ns)
    return out


def refused(lake, engine, spec) -> SchemaMismatchError:
    """Runs `spec` over a string `px`: refused before anything is read or written (the watermark and
    every table and record Laminar writes stay as they were), and counted as a failed run."""
    before, files = engine.store.load(spec.name, PART), written(lake)
    with pytest.raises(SchemaMismatchError) as caught:
        engine.run(spec, PART)
    after = engine.store.load(spec.name, PART)
    assert (after.seq, after.source_versions, after.failed_attempt) == (before.seq, before.source_versions, None)
    assert after.failed_runs is not None and after.failed_runs.count == 1
    assert written(lake) == files
    message = caught.value.message
    assert "\n" not in message
    for fact in (f"'{spec.name}'", "'trades'", "'px'", "double at version 0", "string", "version 1", "Restore the column's type"):
        assert fact in message, message
    return caught.value


@pytest.mark.spark
def test_a_stage_rule_over_a_retyped_column_is_refused_then_heals(spark, lake, engine):
    """On main the check passed (Spark compares a string with 0 by an implicit cast) and the sweep
    failed inside Spark: "quarantine sweep of 'clean' failed: [CAST_INVALID_INPUT] The value '1.5' of
    the type "STRING" cannot be cast to "BIGINT" ...", on every run while `px` stayed a string."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 1), ("2024-01-01 00:02:00", "b", -1.0, 1)])
    engine.run(CLEAN, PART)
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 1)], "string")
    exc = refused(lake, engine, CLEAN)
    assert "rule positive_px" in exc.message and exc.facts["column"] == "px"
    # a partition never run has nothing to compare with: it runs (it holds no row, so nothing is cast)
    assert engine.run(CLEAN, NEXT).reason is Reason.NO_WATERMARK
    retype(lake, [("2024-01-01 00:04:00", "a", 3.5, 1), ("2024-01-01 00:05:00", "b", -2.0, 1)], "float64")
    first, second = engine.run_many(CLEAN, [PART, NEXT])  # NEXT read px as a string: restored, not refused
    assert (first.mode, first.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    assert second.mode is not Mode.NOOP or second.reason is Reason.NO_CHANGES_IN_PARTITION
    assert sorted(lake.read("clean")["px"]) == [3.5]


@pytest.mark.spark
def test_a_derived_column_over_a_retyped_column_is_refused_then_heals(spark, lake, engine):
    """On main the derived `px * qty` compiled over a string `px` and the pass failed inside Spark's
    cast (CAST_INVALID_INPUT)."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 2)])
    engine.run(NOTIONAL, PART)
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "string")
    exc = refused(lake, engine, NOTIONAL)
    assert "derived column notional" in exc.message
    with pytest.raises(RunFailedError, match=r"CAST_INVALID_INPUT.*\(in `px \* qty`\)"):  # never run: Spark's cast fails
        engine.run(replace(NOTIONAL, name="never_run", sink="never_run"), PART)
    retype(lake, [("2024-01-01 00:04:00", "a", 3.5, 2)], "float64")
    r = engine.run(NOTIONAL, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    assert_frames_match(lake.read("notional"), full_recompute(spark, NOTIONAL, lake.table("trades").to_pyarrow_table()),
                        NOTIONAL.keys)


# --- the comparison, without Spark ------------------------------------------------------------------

def watermark(lake, spec, version: int, key: str = PART) -> Watermark:
    """A committed watermark of `spec` that read `trades` at `version`."""
    return Watermark(spec.name, key, spec.spec_hash, {"trades": version}, seq=1,
                     source_ids={"trades": lake.table("trades").metadata().id})


def check_reads(lake, spec, marks: dict) -> None:
    """`refuse_retyped_reads` over the inputs a run gathers (the Spark schema check left out)."""
    inputs = gather(Layout(lake.root), spec, marks.values(), lambda info, dims: CheckedSource({}, None))
    refuse_retyped_reads(spec, marks, inputs)


def test_the_columns_a_spec_reads_include_what_its_expressions_use():
    spec = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    rules=(RowRule("sane", "`Qty` >= 0"),),
                    derived={"px": "CAST(trades.PX AS DOUBLE)", "lots": "size(filter(fills, x -> x > px))"},
                    filter="px > 0 AND venue <> 'px'", post={"avg": "sum_px / count"},
                    aggregates=(Agg.count(), Agg.sum("px"), Agg.sql("count_if(note >< 1", name="n_big")))
    columns = ["ts", "sym", "PX", "qty", "fills", "venue", "note", "unused", "x", "avg"]
    assert columns_read(spec, "trades", columns) == {
        "ts": "the event time", "sym": "a key", "qty": "rule sane", "px": "derived column px",
        "fills": "derived column lots", "venue": "the filter", "note": "aggregate n_big"}
    assert expression_columns("s.a + `My Col` - t.qty") == {"s", "a", "My Col", "t", "qty"}
    stage = StageSpec(name="s", source="trades", event_time="ts", derived={"px": "px * 2"})
    assert columns_read(stage, "trades", ["ts", "px", "qty"]) == {
        "ts": "the event time", "px": "derived column px", "qty": "passed through"}


def test_type_families():
    assert {type_family(t) for t in ("byte", "integer", "long", "double", "decimal(10,2)")} == {"numeric"}
    assert {type_family(t) for t in ("string", "varchar(3)", "char(1)")} == {"string"}
    assert {type_family(t) for t in ("timestamp", "timestamp_ntz", "date")} == {"temporal"}
    assert type_family('{"type":"struct","fields":[]}') == "struct" != type_family('{"type":"array"}')
    assert type_family("boolean") != type_family("binary")


def test_within_a_family_unread_columns_and_new_specs_are_not_refused(lake):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 2)])
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "float32")  # v1: another number
    check_reads(lake, NOTIONAL, {PART: watermark(lake, NOTIONAL, 0)})
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "string")  # v2: text
    counts = FlowSpec(name="counts", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                      aggregates=(Agg.sum("qty"),))
    check_reads(lake, counts, {PART: watermark(lake, counts, 0)})  # px is not read
    check_reads(lake, NOTIONAL, {PART: None})  # no watermark: the run reads the source as it is now
    other = FlowSpec(**{**NOTIONAL.__dict__, "derived": {"notional": "CAST(px AS DOUBLE) * qty"}})
    check_reads(lake, NOTIONAL, {PART: watermark(lake, other, 0)})  # a spec change refills
    with pytest.raises(SchemaMismatchError, match="was float at version 1, the version partitions 2024-01-01-00:00, "
                       "2024-01-01-01:00 last read"):
        check_reads(lake, NOTIONAL, {k: watermark(lake, NOTIONAL, 1, k) for k in (PART, "2024-01-01-01:00")})


def test_a_cleaned_up_log_is_compared_at_the_oldest_version_it_holds(lake):
    """The log before a checkpoint is gone: the watermark's version cannot be opened, the oldest
    version after it that can be tells the type."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 2)], **{"delta.logRetentionDuration": "interval 0 seconds"})
    lake.append("trades", [("2024-01-01 00:02:00", "a", 1.5, 2)])
    table = lake.table("trades")
    table.create_checkpoint()
    table.cleanup_metadata()  # the log before the checkpoint at version 1 goes
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "string")
    with pytest.raises(SchemaMismatchError, match="double at version 1, the oldest the log still holds after version 0"):
        check_reads(lake, CLEAN, {PART: watermark(lake, CLEAN, 0)})


def test_a_column_restored_to_the_type_it_was_created_with_is_not_refused(lake):
    """A partition first run while the column was text (nothing it read needed a cast) is not refused
    when the producer restores the number the column was created with; once the number is back, text
    again is refused (an earlier text interlude does not make text the column's type)."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 2)])
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "string")  # v1
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "float64")  # v2
    check_reads(lake, NOTIONAL, {PART: watermark(lake, NOTIONAL, 1)})
    retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], "string")  # v3: text again
    with pytest.raises(SchemaMismatchError, match="string at version 3 but was double at version 2"):
        check_reads(lake, NOTIONAL, {PART: watermark(lake, NOTIONAL, 2)})


def test_a_column_switched_back_and_forth_heals_once_it_has_the_type_it_was_created_with(lake):
    """Text twice in between (number, text, number, text, number): a partition that last read the second text
    interlude was refused for good once the number was back, though the producer had restored it (found by
    the stateful test: a stage retyped then restored twice). The column was created a number: it heals."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.5, 2)])
    for kind in ("string", "float64", "string", "float64"):  # versions 1 to 4
        retype(lake, [("2024-01-01 00:03:00", "a", 2.5, 2)], kind)
    check_reads(lake, NOTIONAL, {PART: watermark(lake, NOTIONAL, 3)})
