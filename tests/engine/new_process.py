"""What a run in a new process knows of the lake: nothing this process learned before."""

from __future__ import annotations

import os
import tempfile

from laminar_assets.engine.delta import snapshot_cache, transactions
from laminar_assets.engine.run import unchanged, validate


def as_a_new_process() -> None:
    """Forget what this process learned of the lake, as a run in a new process (the daemon launches each run so)
    knows nothing: pooled and shared snapshots, app transactions read or committed, flows run, sources checked. A
    new `Engine` has a new checkpoint store (the watermarks and the sweep's progress it read). Spark stays warm, as
    a Spark Connect server does between runs. The machine's local copies of log files (`storage.copies`) stay, as
    they do for the daemon's next run: `on_a_new_machine` drops them too."""
    snapshot_cache.clear()
    transactions._read.clear()
    transactions._made.clear()
    unchanged._seen.clear()
    validate._CHECKED.clear()


def on_a_new_machine() -> None:
    """`as_a_new_process` on a machine that keeps no copies of the lake's log files (`storage.copies`): another
    machine, or the first run after the cache folder was cleared. The test's own setting comes back after it."""
    as_a_new_process()
    os.environ["LAMINAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="laminar-copies-")
