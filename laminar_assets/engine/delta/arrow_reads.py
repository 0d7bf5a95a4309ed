"""Delta tables read into Arrow by this process (no Spark): deltalake's pyarrow dataset, its Parquet files read
through pyarrow's own filesystem on the lake instead of a Python one.

Left to itself, `DeltaTable.to_pyarrow_dataset()` (and `to_pyarrow_table()`, `to_pandas()`, which call it) reads
through a Python filesystem: a `pyarrow.fs.PyFileSystem` over deltalake's `DeltaStorageHandler`, whose files are
`pyarrow.PythonFile` objects. An Arrow thread that drops the last reference to one of them needs the GIL; when that
happens while the interpreter tears itself down, the process aborts after its work (SIGABRT, exit code 134,
docs/known-limits.md "Exit codes"). pyarrow's native filesystem (`LocalFileSystem`, or the `S3FileSystem` of the
lake's store options: endpoint, region, credentials, addressing) holds no Python object.

Only the filesystem changes: deltalake takes one (`filesystem=`, rooted at the table, as its documentation shows)
and still decides everything else: the files of the snapshot, their partition values and statistics, the schema,
the refusal of deletion vectors and column mapping. The paths it names are the files' own (the log's paths
decoded once), relative to the table's root.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

from laminar_assets import storage

from .tables import open_delta


def table_filesystem(uri: str) -> pafs.FileSystem:
    """pyarrow's native filesystem rooted at the table `uri` (a path, file:// or s3:// URI)."""
    fs, root = storage.filesystem(uri)
    return pafs.SubTreeFileSystem(root, fs)


def arrow_dataset(uri: str, table: DeltaTable | None = None) -> ds.Dataset:
    """deltalake's pyarrow dataset of the snapshot `table` holds (the latest, when None) of the Delta table at `uri`,
    on pyarrow's native filesystem."""
    dt = table if table is not None else open_delta(uri)
    return dt.to_pyarrow_dataset(filesystem=table_filesystem(uri))


def read_arrow(uri: str, table: DeltaTable | None = None, *, columns: list[str] | None = None,
               filter: ds.Expression | None = None) -> pa.Table:
    """The rows of `arrow_dataset(uri, table)`: what `table.to_pyarrow_table(columns=...)` returns, with `filter`
    a pyarrow expression (it prunes files by their statistics, then filters rows)."""
    return arrow_dataset(uri, table).to_table(columns=columns, filter=filter)
