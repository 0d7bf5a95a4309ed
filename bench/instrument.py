"""Where incremental time goes: wall-clock timers wrapped around a few engine internals, from outside.

Nothing in `laminar_assets` is edited: while `Instrument` is active, these functions are replaced
(in every `laminar_assets.engine` module that holds them) by timing wrappers:

* `Engine.gather`: open the source snapshot with deltalake, read the new commits' log entries
  and Parquet footers, check the spec against the schema (Spark analyzer, no job);
* `uncommitted.write_uncommitted` / `collect_rows` + `write_uncommitted_rows`: the Spark job that computes a run's
  output and writes it as Parquet
  into a table folder (by Spark, or by the driver from Arrow batches), plus footer statistics;
* `DeltaTable.create_write_transaction`: a Delta commit through deltalake;
* `delta.tables.snapshot_files`: listing a pinned snapshot's files with statistics (deltalake).

A name that no longer exists (the engine is being refactored) is skipped and reported in
`missing`, so the harness keeps working and says what it could not measure.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import time
from collections import defaultdict

_TARGETS = (
    ("gather_log_and_schema", "laminar_assets.engine.executor", "Engine", "gather"),
    ("parquet_write", "laminar_assets.engine.output.uncommitted", None, "write_uncommitted"),
    ("parquet_write", "laminar_assets.engine.output.uncommitted", None, "collect_rows"),
    ("parquet_write", "laminar_assets.engine.output.uncommitted", None, "write_uncommitted_rows"),
    ("delta_commit", "deltalake", "DeltaTable", "create_write_transaction"),
    ("snapshot_listing", "laminar_assets.engine.delta.tables", None, "snapshot_files"),
)


class Instrument:
    """Context manager; `seconds[name]` and `calls[name]` accumulate while it is active."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.missing: list[str] = []
        self._undo: list[tuple[object, str, object]] = []
        # per thread: flows may run side by side (their times then add up beyond the wall time)
        self._depth: dict[tuple[str, int], int] = defaultdict(int)
        self._lock = threading.Lock()

    def _wrap(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key = (name, threading.get_ident())
            self._depth[key] += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[key] -= 1
                if self._depth[key] == 0:  # count re-entrant calls once
                    with self._lock:
                        self.seconds[name] += time.perf_counter() - t
                        self.calls[name] += 1
        return wrapper

    def __enter__(self) -> Instrument:
        for name, module_name, cls_name, attr in _TARGETS:
            try:
                module = importlib.import_module(module_name)
                owner = getattr(module, cls_name) if cls_name else module
                original = getattr(owner, attr)
            except (ImportError, AttributeError):
                self.missing.append(f"{module_name}.{cls_name + '.' if cls_name else ''}{attr}")
                continue
            wrapped = self._wrap(name, original)
            self._patch(owner, attr, wrapped)
            if cls_name is None:  # functions imported by name into sibling modules
                for mod_name, mod in list(sys.modules.items()):
                    if mod_name.startswith("laminar_assets.") and mod is not owner and getattr(mod, attr, None) is original:
                        self._patch(mod, attr, wrapped)
        return self

    def _patch(self, owner, attr: str, value) -> None:
        self._undo.append((owner, attr, owner.__dict__[attr] if attr in vars(owner) else getattr(owner, attr)))
        setattr(owner, attr, value)

    def __exit__(self, *exc) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def report(self) -> dict:
        return {"seconds": {k: round(v, 4) for k, v in self.seconds.items()}, "calls": dict(self.calls),
                "missing": list(self.missing)}
