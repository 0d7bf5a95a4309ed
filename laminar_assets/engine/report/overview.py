"""Reports as plain data (JSON-able dicts): the topology, a flow's explanation, and status.

`explain` needs Spark (for the physical plan) but runs no job and writes nothing;
`topology` and `status` need no Spark at all.
"""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime
from typing import Any

from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.errors import LaminarError

from ..aggregates.algebra import implementation
from ..delta.tables import CommitKind, resolve_uri, snapshot_files, source_history, table_info
from ..run.validate import apply_row_logic
from ..spark.read import read_source
from ..spec.specs import RefreshPolicy, Spec
from .staleness import inspect_partition, is_stale


def topology(specs: list[Spec]) -> list[dict]:
    """One row per node: node, kind (source/stage/flow), inputs, outputs, is_shared, partitioning."""
    produced = {s.sink: s for s in specs}
    readers: dict[str, list[str]] = {}
    for s in specs:
        for t in (*s.sources, *s.dimension_tables):
            readers.setdefault(t, []).append(s.name)
    rows = []
    for table in readers:
        if table not in produced:
            rows.append({"node": table, "kind": "source", "inputs": [], "outputs": sorted(readers[table]),
                         "is_shared": len(readers[table]) > 1, "partitioning": None})
    for s in specs:
        outputs = sorted(readers.get(s.sink_name, []))
        rows.append({"node": s.name, "kind": s.kind,
                     "inputs": [*s.sources, *s.dimension_tables],
                     "outputs": outputs, "is_shared": len(outputs) > 1, "partitioning": s.granularity.value})
    return rows


def logical(spec: Spec) -> dict:
    out: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "description": spec.description, "sources": list(spec.sources),
           "event_time": spec.event_time, "filter": spec.filter, "derived": dict(spec.derived),
           "partitioning": spec.granularity.value, "refresh": RefreshPolicy(spec.refresh).value, "sink": spec.sink,
           "spec_hash": spec.spec_hash, "origin": spec.origin or None, "sql": spec.definition or None}
    return {**out, **spec.logical_facts(lambda agg: implementation(agg).describe())}


def _formatted(df) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        df.explain(mode="formatted")
    return buffer.getvalue().strip()


def explain(engine, spec: Spec, partition: str) -> dict:
    """Logical (the spec), physical (Spark's plan of the query a run would execute), strategy (the plan)."""
    mark = engine.store.load(spec.name, partition)
    flow = spec.aggregation()
    if flow is not None:  # a run builds its state; the sink follows from it
        plan, query = engine.state_query(flow, partition)
        physical = _formatted(query)
    else:
        plan = engine.plan(spec, partition)
        src = spec.sources[0]
        info = table_info(src, resolve_uri(engine.root, src))
        physical = _formatted(apply_row_logic(read_source(engine.spark, [], info), spec))
    estimate = {"files": 0, "bytes": 0, "rows": 0}
    pending_commits = []
    for src in spec.sources:
        uri = resolve_uri(engine.root, src)
        since = plan.from_versions.get(src)
        history = source_history(src, uri, since, table_info(src, uri).version, spec.event_time)
        wanted = set(plan.incremental_versions.get(src, ()))
        for c in history.commits:
            pending_commits.append({"table": src, "version": c.version, "operation": c.operation,
                                    "kind": c.kind.value, "rows": c.rows})
            if c.version in wanted:
                files = c.adds if c.kind in (CommitKind.APPEND, CommitKind.DELETION_VECTORS) else c.cdc
                for f in files:
                    if f.time_range is None or f.time_range.overlaps(plan.needed):
                        estimate["files"] += 1
                        estimate["bytes"] += f.size
                        estimate["rows"] += f.rows or 0
        if plan.refill or plan.group_windows:
            info = table_info(src, uri, plan.to_versions[src])
            events = spec.refill_events(plan.interval, (*plan.refill, *plan.group_windows))
            for f in snapshot_files(info, spec.event_time, events):
                estimate["files"] += 1
                estimate["bytes"] += f.size
                estimate["rows"] += f.rows or 0
    strategy = {
        **plan.to_json(),
        "watermark": None if mark is None else {"source_versions": mark.source_versions, "seq": mark.seq,
                                                "spec_hash": mark.spec_hash, "failed_attempt": mark.failed_attempt},
        "pending_commits": pending_commits,
        "estimated_read": estimate,
    }
    return {"logical": logical(spec), "physical": physical, "strategy": strategy}


def failed_runs(mark: Watermark | None) -> dict | None:
    """The runs of a partition that failed in a row since its last success (`Watermark.failed_runs`):
    count, since, last_at, error and run_id; None when its last run succeeded."""
    f = mark.failed_runs if mark is not None else None
    if f is None:
        return None
    return {"count": f.count, "since": f.since, "last_at": f.last_at, "error": f.last_error, "run_id": f.run_id}


def describe_failed_runs(failed: dict) -> str:
    """One line: how many runs failed in a row, since when, and the last one's error."""
    runs = "the last run" if failed["count"] == 1 else f"the last {failed['count']} runs"
    return f"{runs} failed (since {failed['since'][:19].replace('T', ' ')} UTC): {failed['error']}"


def status(root: str, specs: list[Spec]) -> list[dict]:
    """Per spec: materialized partitions, stale ones and why, failing ones (their last run failed: how many
    in a row, since when, the error), watermark vs source versions, pending versions.
    Source versions cover every input the watermark records: the sources and the dimension tables."""
    store = CheckpointStore(root)
    out = []
    for spec in specs:
        latest: dict[str, int | None] = {}
        inputs = (*spec.sources, *spec.dimension_tables)
        for src in inputs:
            uri = resolve_uri(root, src)
            try:
                latest[src] = table_info(src, uri).version
            except LaminarError:  # a missing source shows as None; the partitions below say why
                latest[src] = None
        partitions: list[dict[str, Any]] = []
        stale, failing, held = [], [], []
        for key in store.partitions(spec.name):
            try:
                mark, plan = inspect_partition(root, spec, key, store)
            except LaminarError as exc:  # a source that vanished: report it, don't crash the report
                stale.append({"partition": key, "reason": "ERROR", "detail": str(exc)})
                mark, plan = store.load(spec.name, key), None
            failed = failed_runs(mark)
            if failed:
                failing.append({"partition": key, **failed})
            if mark is not None and mark.holder is not None:  # a run writing it now, or one that died holding it
                h = mark.holder
                held.append({"partition": key, "run_id": h.run_id, "host": h.host, "pid": h.pid,
                             "since": datetime.fromtimestamp(h.started, UTC).isoformat(timespec="seconds"),
                             "gone": store.holder_gone(h, spec.name, key)})
            if plan is None or mark is None:  # or its watermark went between the listing and the read
                continue
            behind = {s: (v - mark.source_versions.get(s, 0)) if (v := latest.get(s)) is not None else None
                      for s in inputs}
            row = {"partition": key, "watermark": mark.source_versions, "versions_behind": behind,
                   "last_mode": mark.last_mode, "last_reason": mark.last_reason, "failed_runs": failed}
            partitions.append(row)
            if is_stale(mark, plan):
                why = plan.reason.value if not mark.failed_attempt else "PREVIOUS_ATTEMPT_FAILED"
                stale.append({"partition": key, "reason": why,
                              "detail": mark.failed_attempt or plan.detail})
        out.append({"flow": spec.name, "kind": spec.kind, "source_versions": latest,
                    "partitions_materialized": len(partitions), "stale_partitions": stale,
                    "failing_partitions": failing, "held_partitions": held,
                    "pending_versions": max((max(v for v in p["versions_behind"].values() if v is not None)
                                             for p in partitions if any(v is not None for v in p["versions_behind"].values())),
                                            default=0),
                    "partitions": partitions})
    return out
