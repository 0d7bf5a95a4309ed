"""Commits whose files hold a column under another type than the table has now (no Spark)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from laminar_assets.engine.delta.log import CommitKind, CommitSummary, DataFile
from laminar_assets.engine.delta.schema_history import column_types, foreign_versions, retyped_commits
from laminar_assets.engine.spark.failures import type_mismatch


def schema(**types) -> str:
    return json.dumps({"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                                    for n, t in types.items()]})


def commit(version: int, *, schema_json: str | None = None, files: bool = True) -> CommitSummary:
    adds = (DataFile(uri=f"/t/{version}.parquet", rows=1, size=1),) if files else ()
    return CommitSummary(version, datetime(2024, 1, 1, tzinfo=UTC), "WRITE",
                         CommitKind.APPEND if files else CommitKind.METADATA, adds=adds, schema=schema_json)


DOUBLE, STRING = schema(ts="timestamp", px="double"), schema(ts="timestamp", px="string")


def test_files_written_while_a_column_had_another_type_are_named():
    asked = []
    commits = [commit(1, schema_json=STRING), commit(2), commit(3, schema_json=DOUBLE), commit(4)]
    found = retyped_commits("t", commits, DOUBLE, {"px"}, lambda: asked.append(1) or DOUBLE)
    assert [v for v, _ in found] == [1, 2] and "column 'px' as string, which the table now has as double" in found[0][1]
    assert not asked  # the first commit set the schema: the one before it is never opened


def test_commits_before_the_first_change_take_the_schema_before_the_range():
    commits = [commit(1), commit(2, schema_json=DOUBLE, files=False)]
    assert [v for v, _ in retyped_commits("t", commits, DOUBLE, {"*"}, lambda: STRING)] == [1]
    assert retyped_commits("t", commits, DOUBLE, {"*"}, lambda: None) == ()  # unknown: the read's backstop


def test_no_schema_change_unread_columns_and_nullability_name_nothing():
    nothing = lambda: (_ for _ in ()).throw(AssertionError("opened"))  # noqa: E731
    assert retyped_commits("t", [commit(1), commit(2)], DOUBLE, {"*"}, nothing) == ()
    assert retyped_commits("t", [commit(1, schema_json=STRING)], DOUBLE, {"ts"}, nothing) == ()
    strict = json.dumps({"type": "struct", "fields": [{"name": "PX", "type": "double", "nullable": False}]})
    assert column_types(strict) == {"px": "double"}
    assert retyped_commits("t", [commit(1, schema_json=strict)], DOUBLE, {"px"}, nothing) == ()


def test_versions_whose_schema_has_a_read_column_in_another_family_are_foreign():
    """Where the schema in effect (a commit's own, the last one's before it, or the range's start)
    has a read column of another family: text between doubles; a float is the same family."""
    floats = schema(ts="timestamp", px="float")
    commits = [commit(1), commit(2, schema_json=STRING, files=False), commit(3), commit(4, schema_json=floats),
               commit(5, schema_json=DOUBLE)]
    assert foreign_versions(commits, DOUBLE, {"px"}, lambda: DOUBLE) == (2, 3)
    assert foreign_versions(commits, DOUBLE, {"*"}, lambda: STRING) == (1, 2, 3)
    assert foreign_versions(commits, DOUBLE, {"ts"}, lambda: STRING) == ()  # px not read
    no_change = [commit(1), commit(2)]  # every version of the range has today's schema
    assert foreign_versions(no_change, DOUBLE, {"*"}, lambda: STRING) == ()


def test_a_spark_read_of_a_retyped_file_is_told_from_other_failures():
    text = ("[FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] Encountered error while reading file "
            "file:///l/t/part-0.parquet. Data type mismatches when reading Parquet column [px]. Expected Spark "
            "type double, actual Parquet type BINARY. SQLSTATE: KD001")
    try:
        try:
            raise RuntimeError(text)
        except RuntimeError as inner:
            raise ValueError("An error occurred while calling o516.getResult.") from inner
    except ValueError as exc:
        assert type_mismatch(exc) == "file file:///l/t/part-0.parquet stores column px as BINARY, read as double"
    assert type_mismatch(RuntimeError("[CAST_INVALID_INPUT] The value '3.0' cannot be cast")) is None


def test_widenings_delta_allows_and_nothing_else():
    from laminar_assets.engine.delta.schema_history import widens
    allowed = [("byte", "short"), ("short", "integer"), ("integer", "long"), ("byte", "long"), ("integer", "double"),
               ("short", "double"), ("float", "double"), ("integer", "decimal(10,0)"), ("integer", "decimal(12,2)"),
               ("long", "decimal(20,0)"), ("byte", "decimal(3,0)"), ("decimal(5,2)", "decimal(10,2)"),
               ("decimal(5,2)", "decimal(7,4)"), ("date", "timestamp_ntz")]
    refused = [("long", "integer"), ("long", "double"), ("double", "float"), ("integer", "decimal(10,1)"),
               ("long", "decimal(19,0)"), ("decimal(10,2)", "decimal(10,3)"), ("decimal(10,2)", "decimal(12,1)"),
               ("date", "timestamp"), ("integer", "integer"), ("string", "long"), ("integer", "string")]
    assert [p for p in allowed if not widens(*p)] == []
    assert [p for p in refused if widens(*p)] == []


def test_commits_that_widened_a_read_column_are_named():
    from laminar_assets.engine.delta.schema_history import widened_commits
    ints, longs = schema(ts="timestamp", qty="integer", px="float"), schema(ts="timestamp", qty="long", px="float")
    commits = [commit(1), commit(2, schema_json=longs, files=False), commit(3)]
    found = widened_commits("t", commits, {"qty"}, lambda: ints)
    assert found == ((2, "column 'qty' of 't' was widened from integer to long at version 2"),)
    assert widened_commits("t", commits, {"px"}, lambda: ints) == ()  # not a column the reader reads
    assert widened_commits("t", [commit(1, schema_json=ints)], {"*"}, lambda: longs) == ()  # narrowed: no widening


def test_a_table_whose_columns_a_schema_only_widens():
    import pyarrow as pa

    from laminar_assets.engine.delta.schema_history import widens_only
    now = pa.schema([("k", pa.string()), ("n", pa.int32()), ("x", pa.float32()), ("d", pa.decimal128(10, 2))])
    assert widens_only(now, pa.schema([("k", pa.string()), ("n", pa.int64()), ("x", pa.float64()),
                                       ("d", pa.decimal128(12, 2)), ("new", pa.int64())]))
    assert not widens_only(now, now)  # nothing wider
    assert not widens_only(now, pa.schema([("k", pa.string()), ("n", pa.int64()), ("x", pa.float32())]))  # d went
    assert not widens_only(now, pa.schema([("k", pa.string()), ("n", pa.int16()), ("x", pa.float32()),
                                           ("d", pa.decimal128(10, 2))]))  # narrowed


def test_a_nested_field_widened_is_a_widening():
    from laminar_assets.engine.delta.schema_history import widened_commits

    def nested(inner: str, name: str = "q") -> str:
        return json.dumps({"type": "struct", "fields": [{"name": "s", "nullable": True, "metadata": {}, "type": {
            "type": "struct", "fields": [{"name": name, "type": inner, "nullable": True, "metadata": {}}]}}]})
    assert [v for v, _ in widened_commits("t", [commit(1, schema_json=nested("long"))], {"s"},
                                          lambda: nested("integer"))] == [1]
    assert widened_commits("t", [commit(1, schema_json=nested("long", "r"))], {"s"}, lambda: nested("integer")) == ()
