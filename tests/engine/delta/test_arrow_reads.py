"""Delta tables read into Arrow by Laminar's own process (no Spark) go through pyarrow's native filesystem on the
lake, never a Python one (whose files can abort the process at exit, docs/known-limits.md "Exit codes"), and give
what deltalake's own read gives; deletion vector files are reached the way data files are."""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from laminar_assets import storage
from laminar_assets.engine.delta import open_delta
from laminar_assets.engine.delta.arrow_reads import read_arrow
from laminar_assets.engine.delta.deletion_vectors import _read_range
from tests.arrow_python_files import forbid_python_files
from tests.object_store import using


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "a lake")  # a space in the path, as a user's folder may have
        return
    with using(request.getfixturevalue("s3_server")) as server:
        yield server.bucket()


def test_a_table_reads_as_deltalake_reads_it_with_no_python_file(root, monkeypatch):
    """Partition values that need escaping in file names, two commits, a pinned version, a filter."""
    uri = storage.join(root, "t")
    keys = ["a b/c%d=e", "x#y?z", "é", None]
    write_deltalake(uri, pa.table({"k": keys, "v": [1, 2, 3, 4]}), partition_by=["k"],
                    storage_options=storage.delta_options(uri))
    write_deltalake(uri, pa.table({"k": keys[:2], "v": [5, 6]}), mode="append", partition_by=["k"],
                    storage_options=storage.delta_options(uri))
    expected = open_delta(uri).to_pyarrow_table().sort_by("v")  # deltalake's own read (a Python filesystem)
    first = open_delta(uri, version=0).to_pyarrow_table().sort_by("v")
    forbid_python_files(monkeypatch)
    assert read_arrow(uri).sort_by("v").equals(expected)
    assert read_arrow(uri, open_delta(uri, version=0)).sort_by("v").equals(first)
    filtered = read_arrow(uri, columns=["v"], filter=pc.field("k") == "a b/c%d=e")
    assert sorted(filtered.column("v").to_pylist()) == [1, 5]


def test_a_deletion_vector_file_is_read_where_the_lakes_data_files_are(root):
    """A local path as it is (not parsed as a URI: a space or a '%' in it stay), an object store with the lake's
    options (pyarrow's guess from an s3:// URI knows neither its endpoint nor its credentials)."""
    uri = storage.join(root, "t", "deletion_vector_0%20.bin")
    storage.write(uri, b"head" + struct.pack(">i", 3) + b"abc" + b"crc!")
    assert _read_range(uri, 4, 3) == b"abc"
