"""A guard for tests: Laminar must not hand pyarrow a Python filesystem or a Python file object to read through.

An Arrow thread that drops the last reference to such a file needs the GIL; during the interpreter's teardown that
aborts the process (SIGABRT, 134: docs/known-limits.md "Exit codes"). deltalake's own reads create them
(`pyarrow.fs.PyFileSystem` over its `DeltaStorageHandler`, whose files are `pyarrow.PythonFile`), and so would an
fsspec filesystem (`PyFileSystem(FSSpecHandler(...))`). Both are made through these module attributes, which the
guard replaces; a file object pyarrow wraps inside its own C code (e.g. `pq.read_table(open(path, "rb"))`) is not
seen: Laminar passes none (grep for it).
"""

from __future__ import annotations

import pyarrow
import pyarrow.fs


def forbid_python_files(monkeypatch) -> None:
    """From now on in this test, making a Python filesystem or a `pyarrow.PythonFile` fails it, naming what."""
    def refused(what: str):
        def make(*args, **kwargs):
            raise AssertionError(f"pyarrow was handed a {what} ({type(args[0]).__name__ if args else '?'}); read "
                                 "through pyarrow's native filesystem (laminar_assets/engine/delta/arrow_reads.py)")
        return make

    monkeypatch.setattr(pyarrow.fs, "PyFileSystem", refused("Python filesystem"))
    monkeypatch.setattr(pyarrow, "PythonFile", refused("Python file object"))
