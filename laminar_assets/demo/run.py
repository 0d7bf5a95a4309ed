"""The end-to-end demo: generate sources, bring every asset up to date, commit late rows,
corrections and cancellations, bring everything up to date again, and show what happened."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa
from deltalake import DeltaTable

from laminar_assets.engine import Engine, FlowSpec, RunResult
from laminar_assets.engine.delta_source import resolve_uri
from laminar_assets.engine.windows import Interval, partitions_overlapping
from laminar_assets.engine.windows import to_utc

from .generator import BatchOptions, BatchSummary, write_batch


@dataclass(frozen=True)
class DemoStep:
    title: str
    batch: BatchSummary
    results: tuple[RunResult, ...]
    seconds: float


def event_range(uri: str, column: str) -> Interval | None:
    """The event-time range of a table, from Delta file statistics (no data scan)."""
    if not DeltaTable.is_deltatable(uri):
        return None
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    lows = [a[f"min.{column}"] for a in actions if a.get(f"min.{column}") is not None]
    highs = [a[f"max.{column}"] for a in actions if a.get(f"max.{column}") is not None]
    if not lows:
        return None
    return Interval(to_utc(min(lows)), to_utc(max(highs)) + timedelta(microseconds=1))


def partitions_for(spec, events: Interval) -> list[str]:
    """Partitions whose windows can hold rows of `events` (hopping windows reach back one window)."""
    if isinstance(spec, FlowSpec):
        events = Interval(events.start - spec.shape.size + spec.shape.slide, events.end)
    return partitions_overlapping(events, spec.granularity)


def bring_up_to_date(engine: Engine, specs, on_result=None) -> list[RunResult]:
    """Run every spec (in dependency order) for every partition its source data touches."""
    results = []
    for spec in specs:
        rng = event_range(resolve_uri(engine.root, spec.sources[0]), spec.event_time)
        if rng is None:
            continue
        for partition in partitions_for(spec, rng):
            result = engine.run(spec, partition)
            results.append(result)
            if on_result:
                on_result(spec, result)
    return results


def run_demo(engine: Engine, specs, *, rows: int, seed: int, on_result=None, fresh: bool = True) -> list[DemoStep]:
    if fresh and os.path.isdir(engine.root):
        shutil.rmtree(engine.root)
    steps = []
    t = time.perf_counter()
    first = write_batch(engine.root, BatchOptions(rows=rows, seed=seed), batch=0)
    results = bring_up_to_date(engine, specs, on_result)
    steps.append(DemoStep("batch 1: in-order trades", first, tuple(results), time.perf_counter() - t))
    t = time.perf_counter()
    second = write_batch(engine.root, BatchOptions(rows=max(rows // 4, 50), seed=seed), batch=1)
    results = bring_up_to_date(engine, specs, on_result)
    steps.append(DemoStep("batch 2: new hour + late rows, duplicates, corrections, cancellations",
                          second, tuple(results), time.perf_counter() - t))
    return steps
