"""Spark reads of Delta file sets: exactly the Parquet files a pinned snapshot or a commit names.

Column-mapped tables are read by physical column name and exposed by logical name;
files with deletion vectors lose their deleted rows, and a commit that changed a
file's vector yields only the changed rows, picked by row position.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from laminar_assets import storage

from ..delta.log import DataFile
from .frames import spark_path, spark_schema

CHANGE_TYPE = "_change_type"
log = logging.getLogger(__name__)


def read_files(
    spark: SparkSession, files: Sequence[DataFile], schema: pa.Schema, partition_columns: Sequence[str] = (),
    *, change_data: bool = False, delta_schema: str | None = None, file_name: str | None = None,
    delta_types: str | None = None,
) -> DataFrame:
    """Rows of `files` with the table's schema; partition values come from the Delta log.

    `delta_schema`: the Delta schema JSON of a table with column mapping: Parquet columns are read
    by their physical names and renamed to the logical ones. A file with a deletion vector loses
    its deleted rows; a file whose vector a commit changed (`DataFile.dv_change`) yields only the
    rows that commit deleted (`_change_type` 'delete') or restored ('insert').
    `file_name`: also a column of this name holding each row's file name (plain reads only).
    `delta_types`: the table's Delta schema (JSON) when it has VARIANT columns: they are read as variants."""
    full = spark_schema(schema, delta_types or delta_schema)
    physical = _physical_fields(delta_schema) if delta_schema else {}
    file_fields = [physical.get(f.name, f) for f in full.fields if f.name not in partition_columns]
    if change_data:
        file_fields.append(StructField(CHANGE_TYPE, StringType(), True))
    file_schema = StructType(file_fields)
    if not files:
        return spark.createDataFrame([], StructType([*full.fields, *([file_schema[CHANGE_TYPE]] if change_data else [])]))
    # logical columns from physical ones (a cast renames nested struct fields too)
    reshaped = bool(physical) or any(f.name in partition_columns for f in full.fields)
    out_cols: list[str | Column] = []  # built only when used: a Column per field costs Py4J round trips
    if reshaped or any(f.needs_row_positions for f in files):
        for field in full.fields:
            if field.name in partition_columns:
                out_cols.append(field.name)
            elif field.name in physical:
                out_cols.append(F.col(f"`{physical[field.name].name}`").cast(field.dataType).alias(field.name))
            else:
                out_cols.append(F.col(f"`{field.name}`"))
    groups: dict[tuple, list[DataFile]] = {}
    for f in files:
        groups.setdefault((f.partition_values, f.needs_row_positions, f.change_data), []).append(f)
    if file_name and any(k[1] for k in groups):
        raise ValueError("file names come with plain reads only (no deletion vectors)")
    out = None
    for (values, by_position, cdf_file), group in groups.items():
        if by_position:
            df = _select_positions(spark, file_schema, group, change_data)
        else:
            df = scan_files(spark, file_schema, group)
            if file_name:  # straight off the scan (the file relation's metadata, even beside a data column `_metadata`)
                df = df.withColumn(file_name, df.metadataColumn("_metadata").getField("file_name"))
            if change_data and not cdf_file:  # data files read as change data (e.g. adds of a DV commit)
                df = df.withColumn(CHANGE_TYPE, F.lit("insert"))
        lookup = dict(values)
        for field in full.fields:
            if field.name in partition_columns:
                df = df.withColumn(field.name, F.lit(lookup.get(field.name)).cast(field.dataType))
        if reshaped or by_position:  # else the scan's columns are in this order already (a select is an analysis)
            df = df.select(*out_cols, *([CHANGE_TYPE] if change_data else []), *([file_name] if file_name else []))
        out = df if out is None else out.unionByName(df)
    assert out is not None  # files, so at least one group
    return out


def read_source(spark: SparkSession, files: Sequence[DataFile], info, *, change_data: bool = False,
                file_name: str | None = None) -> DataFrame:
    """`read_files` with a source's schema, partition columns and column mapping (`info`: a TableInfo)."""
    return read_files(spark, files, info.schema, info.partition_columns, change_data=change_data,
                      delta_schema=info.delta_schema if info.column_mapping != "none" else None,
                      file_name=file_name, delta_types=info.delta_schema)


def scan_files(spark: SparkSession, file_schema: StructType, files: Sequence[DataFile]) -> DataFrame:
    """Spark's scan of exactly the Parquet files `files`, with `file_schema`.

    On an object store, Spark's `spark.read.parquet(paths)` costs three requests per file before any task
    reads it: a HEAD to check the path exists, then its file index lists the path (a LIST, then a HEAD
    that finds it is a file); the task's read adds a HEAD and a GET. The Delta log already says what the
    index looks for, each file's path and size (the `size` Delta requires of every add, which delta-spark's
    own file index takes too), so here the index is built from those statuses (`_known_files`) and
    Spark's requests per file are the read's two (issue #62). Local files, a Spark Connect session (no
    JVM here) and a file whose size the log does not give are read with `spark.read.parquet`: the same
    relation, listed by Spark."""
    paths = [spark_path(f.uri) for f in files]
    if (files and all(f.size > 0 for f in files) and all(storage.is_object_store(f.uri) for f in files)
            and _classic(spark)):
        try:
            return _known_files(spark, file_schema, paths, [f.size for f in files])
        except Py4JError as exc:  # a Spark whose internals differ (the JVM classes below): Spark lists the files
            log.debug("Spark's file index from the log's statuses failed (%s): Spark lists the %d files",
                      str(exc).splitlines()[0][:200], len(files))
    return spark.read.schema(file_schema).parquet(*paths)


def _classic(spark) -> bool:
    return getattr(spark, "_jsparkSession", None) is not None and getattr(spark, "_jvm", None) is not None


def _known_files(spark: SparkSession, file_schema: StructType, paths: list[str], sizes: list[int]) -> DataFrame:
    """The relation `spark.read.schema(file_schema).parquet(*paths)` builds (an `InMemoryFileIndex` of
    the paths, Parquet, no partition columns, the schema made nullable, no options), with the index's
    listing answered from a file-status cache of its own holding each path's status: no request. The
    cache is this read's alone (not the session's shared one) and goes with the index."""
    jvm, jspark = spark._jvm, spark._jsparkSession
    assert jvm is not None and spark._sc._gateway is not None  # classic Spark (`_classic`)
    ds = jvm.org.apache.spark.sql.execution.datasources
    cache = ds.SharedInMemoryCache(_CACHE_BYTES, -1).createForNewClient()  # -1: no time-to-live
    status_class = jvm.org.apache.hadoop.fs.FileStatus
    roots = []
    for path, size in zip(paths, sizes):
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        leaf = spark._sc._gateway.new_array(status_class, 1)
        # length, not a folder, one replica, a block of the file's size, modification time unknown (0)
        leaf[0] = status_class(size, False, 1, size, 0, jpath)
        cache.putLeafFiles(jpath, leaf)
        roots.append(jpath)
    none = jvm.scala.Option.empty()
    schema = jspark.parseDataType(file_schema.json())
    options = jvm.PythonUtils.toScalaMap({})
    index = ds.InMemoryFileIndex(jspark, jvm.PythonUtils.toSeq(roots), options, jvm.scala.Option.apply(schema),
                                 cache, none, none)
    relation = ds.HadoopFsRelation(index, index.partitionSchema(), schema.asNullable(), none,
                                   ds.parquet.ParquetFileFormat(), options, jspark)
    return DataFrame(jspark.baseRelationToDataFrame(relation), spark)


_CACHE_BYTES = 1 << 30  # a bound on the read's own cache: its statuses only (about 1 kB each)


_FILE, _ROW = "__file", "__row"


def _select_positions(spark: SparkSession, file_schema: StructType, files: Sequence[DataFile],
                      change_data: bool) -> DataFrame:
    """Rows of files with deletion vectors, by row position (`_metadata.row_index`): deleted rows
    dropped, or for a changed vector only the changed rows, signed through `_change_type`."""
    names = [os.path.basename(f.uri) for f in files]
    if len(set(names)) != len(names):  # positions are matched by file name: read clashing files apart
        parts = [_select_positions(spark, file_schema, [f], change_data) for f in files]
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out
    df = scan_files(spark, file_schema, files)
    meta = df.metadataColumn("_metadata")  # the file relation's, even beside a data column `_metadata`
    df = df.select("*", meta.getField("file_name").alias(_FILE), meta.getField("row_index").alias(_ROW))
    dropped, changed = [], []
    for f, name in zip(files, names):
        if f.dv_change is not None:
            deleted, restored = f.dv_change.signed_positions()
            changed.append(pa.table({_FILE: pa.array([name] * len(deleted), pa.string()), _ROW: deleted,
                                     "__ct": pa.array(["delete"] * len(deleted), pa.string())}))
            changed.append(pa.table({_FILE: pa.array([name] * len(restored), pa.string()), _ROW: restored,
                                     "__ct": pa.array(["insert"] * len(restored), pa.string())}))
        else:
            assert f.deleted is not None  # needs_row_positions: deleted rows, or a changed vector
            rows = f.deleted.positions()
            dropped.append(pa.table({_FILE: pa.array([name] * len(rows), pa.string()), _ROW: rows}))
    parts = []
    plain = [n for f, n in zip(files, names) if f.dv_change is None]
    if plain:
        kept = df.where(F.col(_FILE).isin(plain))
        positions = _one_chunk(dropped)
        if positions is not None:
            kept = kept.join(F.broadcast(spark.createDataFrame(positions)), [_FILE, _ROW], "left_anti")
        if change_data:
            kept = kept.withColumn(CHANGE_TYPE, F.lit("insert"))
        parts.append(kept)
    if changed:
        if not change_data:
            raise ValueError("a file whose deletion vector changed is change data: read it with change_data=True")
        positions = _one_chunk(changed)
        picked = df.where(F.col(_FILE).isin([n for f, n in zip(files, names) if f.dv_change is not None]))
        picked = picked.drop(CHANGE_TYPE)
        if positions is not None:
            picked = picked.join(F.broadcast(spark.createDataFrame(positions)), [_FILE, _ROW], "inner") \
                .withColumnRenamed("__ct", CHANGE_TYPE)
        else:
            picked = picked.where(F.lit(False)).withColumn(CHANGE_TYPE, F.lit(None).cast("string"))
        parts.append(picked)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.drop(_FILE, _ROW)


def _one_chunk(tables: list[pa.Table]) -> pa.Table | None:
    """The tables as one table of one chunk, None if empty. PySpark 4.3's createDataFrame(arrow)
    silently drops the chunks after an empty one, so an empty chunk must never reach it."""
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables).combine_chunks() if tables else None


def _physical_fields(delta_schema: str) -> dict[str, StructField]:
    """Logical column name -> the field as stored in Parquet (physical names, nested ones too)."""
    def physical_type(t):
        if isinstance(t, dict) and t.get("type") == "struct":
            return {**t, "fields": [{**f, "name": _physical_name(f), "type": physical_type(f["type"]), "metadata": {}}
                                    for f in t["fields"]]}
        if isinstance(t, dict) and t.get("type") == "array":
            return {**t, "elementType": physical_type(t["elementType"])}
        if isinstance(t, dict) and t.get("type") == "map":
            return {**t, "keyType": physical_type(t["keyType"]), "valueType": physical_type(t["valueType"])}
        return t

    schema = json.loads(delta_schema)
    stored = StructType.fromJson(physical_type(schema))
    return {f["name"]: StructField(stored.fields[i].name, stored.fields[i].dataType, True)
            for i, f in enumerate(schema["fields"])}


def _physical_name(field: dict) -> str:
    return (field.get("metadata") or {}).get("delta.columnMapping.physicalName", field["name"])
