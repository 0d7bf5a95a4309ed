"""Dagster's standard table metadata for a sink, from its Delta log alone (no Spark job).

The UI shows `dagster/column_schema` as the asset's columns, `dagster/row_count` and
`dagster/partition_row_count` as numbers it plots, and `dagster/table_name` /
`dagster/uri` tell catalogs where the table lives.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from laminar_assets.engine import LaminarError, Spec, partition_interval
from laminar_assets.engine.delta import snapshot_files, table_info
from laminar_assets.orchestration.internals.private_names import TableMetadataSet

URI_KEY = "dagster/uri"


def table_metadata(spec: Spec, sink_uri: str, partitions: Sequence[str] = (), *,
                   table_name: str | None = None) -> tuple[dict, dict]:
    """Schema, row count, name and URI of the spec's sink, and `dagster/partition_row_count` for each of
    `partitions`: (table metadata, {partition: its metadata}). Both empty when the sink does not exist
    yet (nothing was ever written). `table_name`: the sink's name in the catalog its engine registers it in
    (`laminar.vwap_1m`, which a query engine resolves); default its name under the root."""
    try:
        info = table_info(spec.sink_name, sink_uri)
    except LaminarError:
        return {}, {}
    columns = [dg.TableColumn(name=f.name, type=str(f.type), description=_describe(spec, f.name))
               for f in info.schema]
    rows = sum(f.rows or 0 for f in snapshot_files(info, None))
    md = dict(TableMetadataSet(column_schema=dg.TableSchema(columns=columns), row_count=rows,
                                      table_name=table_name or spec.sink_name))
    md[URI_KEY] = dg.MetadataValue.path(sink_uri)
    # flow sinks are laid out by window start, stage outputs by event time: a file per partition, or per run of
    # adjacent partitions a batched pass wrote; a partition with such a file gets no count (the log holds the
    # file's rows, not how many of them are the partition's), never another partition's rows
    column = spec.output_time_column
    per_partition = {}
    for key in partitions:
        part = partition_interval(key, spec.granularity)
        inside = snapshot_files(info, column, [part])
        if all(f.time_range is not None and part.start <= f.time_range.start and f.time_range.end <= part.end
               for f in inside):
            per_partition[key] = dict(TableMetadataSet(partition_row_count=sum(f.rows or 0 for f in inside)))
    return {k: v for k, v in md.items() if v is not None}, per_partition


def _describe(spec: Spec, column: str) -> str | None:
    return spec.column_description(column)
