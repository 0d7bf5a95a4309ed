"""What a run writes: Parquet files staged in folders of their own (`staged_files`), and the Delta
commits that publish them (`commit`). A file a commit may name is never deleted."""

from .commit import replace_ranges
from .staged_files import StagedFiles, committed, scope, write_staged, write_staged_rows

__all__ = ["StagedFiles", "committed", "replace_ranges", "scope", "write_staged", "write_staged_rows"]
