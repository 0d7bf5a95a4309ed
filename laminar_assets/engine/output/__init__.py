"""What a run writes: Parquet files written ahead of the commit that names them, in folders of their
own (`uncommitted`), and the Delta commits that publish them (`commit`). A file a commit may name is
never deleted."""

from .commit import replace_ranges
from .uncommitted import UncommittedFiles, committed, scope, write_uncommitted, write_uncommitted_rows

__all__ = ["UncommittedFiles", "committed", "replace_ranges", "scope", "write_uncommitted", "write_uncommitted_rows"]
