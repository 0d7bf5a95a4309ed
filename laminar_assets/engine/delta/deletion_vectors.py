"""Deletion vectors: which rows of a data file a Delta table no longer holds.

A deletion vector (DV) marks rows of a Parquet file as deleted without rewriting
the file. The add action of the file names its DV; a commit that deletes more rows
replaces the add (remove + add of the same path) with a larger DV. So:

- a read of a file skips the rows of its DV (`DataFile.deleted`);
- a commit that changes a file's DV deleted exactly the rows in new − old and
  restored those in old − new (`DvChange`), which is the change data of the commit
  even when the table has no change data feed.

Descriptors from the log are decoded here (the Delta protocol's "Deletion Vector
Format": Z85 names, a `RoaringBitmapArray` in portable format, read with `pyroaring`).
Snapshots get their vectors from `deltalake` itself (`DeltaTable.deletion_vectors()`),
so the two decoders check each other in the tests; a table `deltalake` refuses to scan (type
widening, the vacuum protocol check) gets them from its log (`log_deleted_rows`).
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs  # noqa: F401  (pa.fs)
import pyarrow.parquet as pq
from pyroaring import BitMap64

from laminar_assets import storage
from laminar_assets.errors import SourceError

_MAGIC = 1681511377  # little-endian int32 in front of a serialized RoaringBitmapArray
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ RFC 32) text to bytes; Delta pads to a multiple of 5 characters itself."""
    if len(text) % 5:
        raise ValueError(f"Z85 text must be a multiple of 5 characters, got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for ch in text[i:i + 5]:
            value = value * 85 + _Z85_INDEX[ch]
        out += value.to_bytes(4, "big")
    return bytes(out)


def decode_bitmap(data: bytes) -> BitMap64:
    """A serialized RoaringBitmapArray (magic + portable 64-bit roaring) as a bitmap of row positions."""
    if len(data) < 4 or struct.unpack_from("<i", data)[0] != _MAGIC:
        raise ValueError("not a RoaringBitmapArray (bad magic number)")
    return BitMap64.deserialize(data[4:])


@dataclass(frozen=True)
class DeletionVector:
    """A deletion vector as an add or remove action names it (storage type u, i or p)."""

    table_uri: str
    storage: str
    path_or_inline: str
    offset: int | None
    size: int
    cardinality: int

    @classmethod
    def from_action(cls, table_uri: str, dv: dict | None) -> DeletionVector | None:
        if not dv:
            return None
        return cls(table_uri, dv["storageType"], dv["pathOrInlineDv"], dv.get("offset"),
                   int(dv["sizeInBytes"]), int(dv["cardinality"]))

    @property
    def file_uri(self) -> str | None:
        """Where the vector is stored; None for an inline vector."""
        if self.storage == "i":
            return None
        if self.storage == "p":
            return self.path_or_inline
        if self.storage != "u":
            raise SourceError(f"unknown deletion vector storage type {self.storage!r} in table {self.table_uri}")
        prefix, encoded = self.path_or_inline[:-20], self.path_or_inline[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{self.table_uri}/{prefix}/{name}" if prefix else f"{self.table_uri}/{name}"

    def bitmap(self) -> BitMap64:
        """The deleted row positions (read once per process: vectors are immutable)."""
        return _bitmap(self)


@lru_cache(maxsize=1024)
def _bitmap(dv: DeletionVector) -> BitMap64:
    if dv.storage == "i":
        data = z85_decode(dv.path_or_inline)[:dv.size]
    else:
        uri = dv.file_uri
        assert uri is not None  # only an inline vector (storage "i") has no file
        try:
            data = _read_range(uri, dv.offset or 0, dv.size)
        except OSError as exc:
            raise SourceError(f"cannot read deletion vector {uri} of table {dv.table_uri}: {exc}; "
                              "was it vacuumed?") from exc
    try:
        bitmap = decode_bitmap(data)
    except ValueError as exc:
        raise SourceError(f"deletion vector {dv.file_uri or '(inline)'} of table {dv.table_uri} is "
                          f"unreadable: {exc}") from exc
    if len(bitmap) != dv.cardinality:
        raise SourceError(f"deletion vector {dv.file_uri or '(inline)'} of table {dv.table_uri} holds "
                          f"{len(bitmap)} rows, its descriptor says {dv.cardinality}")
    return bitmap


def _read_range(uri: str, offset: int, size: int) -> bytes:
    """The vector bytes of a DV file: at `offset` a big-endian size, the vector, then a checksum. A file beside the
    table is reached as its data files are: a local path as it is (spaces and '%' included), the lake's object
    store with the lake's options (endpoint, credentials, addressing), which pyarrow's guess from a URI knows
    nothing of. Any other URI (a vector stored by absolute path) is pyarrow's to resolve."""
    if "://" not in uri or storage.is_object_store(uri):
        fs, path = storage.filesystem(uri)
    else:
        fs, path = pa.fs.FileSystem.from_uri(uri)
    with fs.open_input_file(path) as fh:
        fh.seek(offset)
        head = fh.read(4)
        (length,) = struct.unpack(">i", head)
        if length != size:
            raise OSError(f"size at offset {offset} is {length}, the descriptor says {size}")
        return fh.read(size)


@dataclass(frozen=True, eq=False)
class DeletedRows:
    """Row positions a read of one file skips: from a log descriptor or from `deltalake`'s selection."""

    vector: DeletionVector | None = None
    positions_from_selection: pa.Array | None = None

    @property
    def count(self) -> int:
        if self.vector is not None:
            return self.vector.cardinality
        assert self.positions_from_selection is not None  # one of the two says which rows
        return len(self.positions_from_selection)

    def positions(self) -> pa.Array:
        if self.vector is not None:
            return pa.array(self.vector.bitmap().to_array(), pa.int64())
        return self.positions_from_selection

    @classmethod
    def from_selection(cls, selection: pa.Array) -> DeletedRows | None:
        """`deltalake`'s selection vector (True = row kept; rows past its end are kept)."""
        dropped = pc.indices_nonzero(pc.invert(selection)).cast(pa.int64())
        return cls(positions_from_selection=dropped) if len(dropped) else None


@dataclass(frozen=True)
class DvChange:
    """A commit replaced a file's deletion vector `old` by `new`: rows in new − old were deleted,
    rows in old − new restored (a RESTORE can shrink a vector)."""

    old: DeletionVector | None
    new: DeletionVector | None

    def _sets(self) -> tuple[BitMap64, BitMap64]:
        old = self.old.bitmap() if self.old else BitMap64()
        new = self.new.bitmap() if self.new else BitMap64()
        return new - old, old - new

    def signed_positions(self) -> tuple[pa.Array, pa.Array]:
        """(deleted, restored) row positions."""
        deleted, restored = self._sets()
        return pa.array(deleted.to_array(), pa.int64()), pa.array(restored.to_array(), pa.int64())

    @property
    def rows(self) -> int:
        """Rows the change touches, from the descriptors (exact when the new vector contains the old)."""
        new = self.new.cardinality if self.new else 0
        old = self.old.cardinality if self.old else 0
        return abs(new - old)


def snapshot_deleted_rows(dt) -> dict[str, DeletedRows]:
    """Deleted rows of every file of a pinned snapshot with a deletion vector, keyed by file path as
    `deltalake` reports it: a URL, percent-encoded (`file:///t/p=a%20b/...` for the folder `p=a b`)."""
    table = pa.table(dt.deletion_vectors())
    out = {}
    for path, selection in zip(table.column("filepath").to_pylist(), _flat_lists(table.column("selection_vector"))):
        rows = DeletedRows.from_selection(selection)
        if rows is not None:
            out[path] = rows
    return out


def _flat_lists(column: pa.ChunkedArray):
    for chunk in column.chunks:
        for i in range(len(chunk)):
            yield chunk[i].values


def log_deleted_rows(table_uri: str, version: int) -> dict[str, DeletedRows]:
    """Deleted rows of every file of the snapshot at `version` with a deletion vector, keyed by the file's
    URI (`table_uri`/its decoded path), from the Delta log itself: the latest checkpoint at or before
    `version` (classic, multi-part, or v2 with its sidecars) and the JSON commits after it. For tables whose
    reader features `deltalake` refuses to scan (`DeltaTable.deletion_vectors()` fails on `typeWidening` and
    `vacuumProtocolCheck`: `tables.UNSCANNED_BY_DELTALAKE`)."""
    log = f"{table_uri}/_delta_log"
    # the log's own files: the listing goes into `_sidecars/` too, whose files a v2 checkpoint names (delta-spark
    # calls them `<version>.checkpoint.0000000001.0000000001.<uuid>.parquet`: taken for the log's, they were
    # opened in the wrong folder, #63)
    names = sorted(f.rsplit("/", 1)[-1] for f, _ in storage.list_files(log) if f.rsplit("/", 2)[-2] == "_delta_log")
    points = sorted({int(n[:20]) for n in names if n[:20].isdigit() and ".checkpoint" in n and int(n[:20]) <= version})
    # a logical file is its path and its vector's id: a commit that gives a file a vector adds (path, new)
    # and removes (path, old), in either order in its entry
    live: dict[tuple[str, str | None], dict | None] = {}
    start = 0
    if points:
        start = points[-1] + 1
        for add in _checkpoint_adds(log, [n for n in names if n.startswith(f"{points[-1]:020d}.checkpoint")]):
            live[_file_id(add)] = add.get("deletionVector")
    versions = range(start, version + 1)
    for v, data in zip(versions, storage.read_many([f"{log}/{v:020d}.json" for v in versions])):  # side by side
        if data is None:
            raise SourceError(f"commit {v} of the Delta table at {table_uri} is gone from its log, so the deletion "
                              f"vectors of its snapshot at version {version} cannot be read", version=v)
        for line in data.decode("utf-8").splitlines():
            if '"add"' not in line and '"remove"' not in line:
                continue
            action = json.loads(line)
            if action.get("add"):
                live[_file_id(action["add"])] = action["add"].get("deletionVector")
            elif action.get("remove"):
                live.pop(_file_id(action["remove"]), None)
    out = {}
    for (path, _id), dv in live.items():
        vector = DeletionVector.from_action(table_uri, dv)
        if vector is not None and vector.cardinality:
            plain = unquote(path)
            out[plain if "://" in plain or plain.startswith("/") else f"{table_uri}/{plain}"] = DeletedRows(vector)
    return out


def _file_id(action: dict) -> tuple[str, str | None]:
    """An add or remove action's logical file: its path and its deletion vector's unique id (the protocol's
    storage type + path or inline data + @offset), None without a vector."""
    dv = action.get("deletionVector")
    if not dv:
        return action["path"], None
    offset = dv.get("offset")
    return action["path"], f"{dv['storageType']}{dv['pathOrInlineDv']}" + (f"@{offset}" if offset is not None else "")


def _checkpoint_adds(log: str, names: list[str]) -> list[dict]:
    """The add actions of one checkpoint's files (the parts of a multi-part one; a v2 checkpoint's own file,
    Parquet or JSON, and the sidecar files it names)."""
    adds: list[dict] = []
    sidecars: list[str] = []
    for name in names:
        if name.endswith(".json"):
            for line in (storage.read(f"{log}/{name}") or b"").decode("utf-8").splitlines():
                action = json.loads(line) if line.strip() else {}
                if action.get("add"):
                    adds.append(action["add"])
                if action.get("sidecar"):
                    sidecars.append(action["sidecar"]["path"])
            continue
        adds += [r for r in _parquet_column(f"{log}/{name}", "add") if r]
        sidecars += [r["path"] for r in _parquet_column(f"{log}/{name}", "sidecar") if r]
    for path in sidecars:
        uri = path if "://" in path or path.startswith("/") else f"{log}/_sidecars/{path}"
        adds += [r for r in _parquet_column(uri, "add") if r]
    return adds


def _parquet_column(uri: str, column: str) -> list:
    """A top-level column of a Parquet file of the log as Python values ([] when the file lacks it)."""
    fs, path = storage.filesystem(uri)
    if column not in pq.read_schema(path, filesystem=fs).names:
        return []
    return pq.read_table(path, filesystem=fs, columns=[column]).column(column).to_pylist()
