"""Deletion-vector and column-rename commits for test tables, written the way Databricks and delta-spark write them.

`deltalake` reads deletion vectors but does not write them, so these helpers do what
a DV-enabled writer does: a `RoaringBitmapArray` in a `deletion_vector_<uuid>.bin`
file, and one commit that removes the file with its old vector and adds it back with
the new one. Every helper checks the result with `deltalake`'s own reader
(`QueryBuilder` applies deletion vectors), so a wrong fixture fails loudly.
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
import zlib
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder
from pyroaring import BitMap64

from laminar_assets.engine.delta.deletion_vectors import DeletionVector

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            value, rem = divmod(value, 85)
            chunk.append(_Z85[rem])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def snapshot(path: str, version: int | None = None) -> pa.Table:
    """Every live row at `version` through deltalake's reader (deletion vectors applied)."""
    dt = DeltaTable(path, version=version)
    table = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}  # Spark takes no view types
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


def _commit(path: str, actions: list[dict], operation: str) -> int:
    version = DeltaTable(path).version() + 1
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": operation,
                           "operationParameters": {}, "engineInfo": "laminar-tests"}}
    target = os.path.join(path, "_delta_log", f"{version:020d}.json")
    with open(target, "x", encoding="utf-8") as fh:
        for action in [info, *actions]:
            fh.write(json.dumps(action) + "\n")
    return version


def enable_deletion_vectors(path: str, *, also: tuple[str, ...] = ()) -> int:
    """Upgrade the protocol to reader 3 / writer 7 with the deletionVectors feature (and the reader-writer
    features `also`, e.g. vacuumProtocolCheck)."""
    dt = DeltaTable(path)
    meta = _latest(path, "metaData")
    meta["configuration"] = {**meta.get("configuration", {}), "delta.enableDeletionVectors": "true"}
    writer = ["deletionVectors", *also]
    readers = ["deletionVectors", *also]
    conf = meta["configuration"]
    if conf.get("delta.enableChangeDataFeed") == "true":
        writer.append("changeDataFeed")
    if conf.get("delta.columnMapping.mode", "none") != "none":
        writer.append("columnMapping")
        readers.append("columnMapping")
    proto = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": readers, "writerFeatures": writer}
    del dt
    return _commit(path, [{"protocol": proto}, {"metaData": meta}], "SET TBLPROPERTIES")


def _latest(path: str, kind: str) -> dict:
    found = None
    log = os.path.join(path, "_delta_log")
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            for line in open(os.path.join(log, name), encoding="utf-8"):
                action = json.loads(line)
                if kind in action:
                    found = action[kind]
    assert found is not None, f"no {kind} action in {path}"
    return found


def live_adds(path: str) -> dict[str, dict]:
    """The add actions of the files live at the table's latest JSON commit (a plain log replay)."""
    live: dict[str, dict] = {}
    log = os.path.join(path, "_delta_log")
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            for line in open(os.path.join(log, name), encoding="utf-8"):
                action = json.loads(line)
                if "add" in action:
                    live[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    live.pop(action["remove"]["path"], None)
    return live


def _write_vector(path: str, bitmap: BitMap64) -> dict:
    data = struct.pack("<i", 1681511377) + bitmap.serialize()
    ident = uuid.uuid4()
    with open(os.path.join(path, f"deletion_vector_{ident}.bin"), "wb") as fh:
        fh.write(b"\x01" + struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
    return {"storageType": "u", "pathOrInlineDv": z85_encode(ident.bytes), "offset": 1,
            "sizeInBytes": len(data), "cardinality": len(bitmap)}


def delete_where(path: str, predicate, *, column_names: dict[str, str] | None = None) -> int:
    """Delete rows through deletion vectors: `predicate(table) -> boolean array` over each data file's
    rows (pyarrow, logical column names). One commit; returns its version, -1 if nothing matched."""
    before = snapshot(path).num_rows
    live = live_adds(path)
    actions, deleted = [], 0
    physical = {v: k for k, v in (column_names or {}).items()}  # physical -> logical
    for rel, add in live.items():
        table = pq.read_table(os.path.join(path, unquote(rel)))  # the log's paths are URL-encoded
        table = table.rename_columns([physical.get(n, n) for n in table.column_names])
        for col, value in (add.get("partitionValues") or {}).items():
            name = physical.get(col, col)
            if name not in table.column_names:
                table = table.append_column(name, pa.array([value] * table.num_rows))
        old = DeletionVector.from_action(path, add.get("deletionVector"))
        old_rows = old.bitmap() if old else BitMap64()
        hits = pc.indices_nonzero(pc.fill_null(predicate(table), False)).to_pylist()
        new_rows = BitMap64(hits) | old_rows
        if new_rows == old_rows:
            continue
        deleted += len(new_rows) - len(old_rows)
        remove = {"path": rel, "deletionTimestamp": int(time.time() * 1000), "dataChange": True,
                  "extendedFileMetadata": True, "partitionValues": add.get("partitionValues") or {},
                  "size": add["size"]}
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        stats = json.loads(add.get("stats") or "{}")
        stats["tightBounds"] = False
        new_add = {**add, "dataChange": True, "stats": json.dumps(stats), "deletionVector": _write_vector(path, new_rows),
                   "modificationTime": int(time.time() * 1000)}
        actions += [{"remove": remove}, {"add": new_add}]
    if not actions:
        return -1
    version = _commit(path, actions, "DELETE")
    after = snapshot(path).num_rows
    assert after == before - deleted, f"deltalake reads {after} rows, expected {before} - {deleted}"
    return version


def rename_column(path: str, old: str, new: str) -> int:
    """RENAME COLUMN on a column-mapped table: a metadata commit that keeps the physical name."""
    meta = _latest(path, "metaData")
    schema = json.loads(meta["schemaString"])
    assert any(f["name"] == old for f in schema["fields"]), f"no column {old!r}"
    for f in schema["fields"]:
        if f["name"] == old:
            f["name"] = new
    meta["schemaString"] = json.dumps(schema)
    meta["partitionColumns"] = [new if c == old else c for c in meta.get("partitionColumns", [])]
    version = _commit(path, [{"metaData": meta}], "RENAME COLUMN")
    assert new in DeltaTable(path).schema().to_arrow().names
    return version
