"""What a Parquet footer says about the event time (for change data files, which have no statistics
in the Delta log)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_assets.engine.file_ranges import footer_facts


def test_footer_facts_read_the_top_level_column_not_a_nested_field_of_the_same_name(tmp_path):
    ts = pa.timestamp("us", tz="UTC")
    at = datetime(2024, 1, 1, 0, 5, tzinfo=timezone.utc)
    table = pa.table({
        "meta": pa.array([{"ts": at}, {"ts": at}], type=pa.struct([("ts", ts)])),  # a leaf named `ts` too
        "ts": pa.array([None, datetime(2024, 1, 1, 0, 7, tzinfo=timezone.utc)], type=ts),
        "id": pa.array([1, 2], type=pa.int32()),
    })
    path = str(tmp_path / "part.parquet")
    pq.write_table(table, path)
    rng, rows, nulls = footer_facts(path, "ts")
    assert (rows, nulls) == (2, 1)
    assert rng is not None and rng.start == datetime(2024, 1, 1, 0, 7, tzinfo=timezone.utc)
    assert footer_facts(path, "missing") == (None, 2, None)
