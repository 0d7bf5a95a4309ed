"""What a run in a new process knows of the lake: nothing this process learned before."""

from __future__ import annotations

from laminar_assets.engine.delta import snapshot_cache, transactions
from laminar_assets.engine.run import unchanged, validate


def as_a_new_process() -> None:
    """Forget what this process learned of the lake, as a run in a new process (the daemon launches each run so)
    knows nothing: pooled and shared snapshots, app transactions read or committed, flows run, sources checked. A
    new `Engine` has a new checkpoint store (the watermarks and the sweep's progress it read). Spark stays warm, as
    a Spark Connect server does between runs."""
    snapshot_cache.clear()
    transactions._read.clear()
    transactions._made.clear()
    unchanged._seen.clear()
    validate._CHECKED.clear()
