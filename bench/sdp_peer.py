"""The peer a user can pick without leaving the pyspark wheel: Spark Declarative Pipelines (SDP).

What it measures: how long `spark-pipelines run` (the CLI in the pyspark wheel) takes to bring two
materialized views, equivalent to the bench's flows, up to date after Δ is appended, having
processed the base in an earlier run; whether the refresh recomputed the whole table; and whether
its tables equal the full recompute.

Set-up, in a project folder written here (`write_project`; a plain SDP project a user could run):
* `spark-pipeline.yml` (name, storage, `spark.sql.shuffle.partitions` as in the bench's session)
  and `transformations/flows.sql`: one `CREATE MATERIALIZED VIEW` per flow, generated from its
  FlowSpec (`flow_sql`: the same windows, keys, derived columns, aggregates and post expressions as
  the full recompute's `reference_query`), reading `parquet.<folder>`;
* the folder holds hard links to the Delta table's data files, the base's first, then Δ's, as for
  the Structured Streaming peer (the Delta JVM connector is not available here);
* `conf/spark-defaults.conf` (SPARK_CONF_DIR): a Hive catalog on an embedded Derby metastore in
  the project, so the tables outlive the command (with the default in-memory catalog the second run
  fails: LOCATION_ALREADY_EXISTS), the bench's driver memory, and a Spark event log. These are static
  settings: put in the spec's `configuration` they fail (CANNOT_MODIFY_STATIC_CONFIG), and as
  `--conf` flags some are lost (the local Connect server keeps only the last chunk of
  PYSPARK_REMOTE_INIT_CONF_*).

Per run: wall time of the whole command (a JVM for spark-submit, Python, a second JVM with the local
Spark Connect server, the Hive metastore, the graph, the flows), and from the event log the Spark
time of the refresh (the `start_run` pipeline command, from start to finish), its Spark jobs, and the
rows its tasks read and wrote; the CPU and memory of the command's processes (`measure.GroupWatch`).
A refresh recomputed the whole table when it read every source row, wrote every output row and kept
none of the tables' previous files. The local Connect server binds port 15002: a run fails if it is taken.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .sdp_command import run_command
from .sdp_project import write_project

if TYPE_CHECKING:
    from laminar_assets.engine import FlowSpec


# --- the peer ----------------------------------------------------------------------------------


class SdpPeer:
    """One SDP project under `work` (see the module docstring): a materialized view per flow."""

    def __init__(self, specs: list[FlowSpec], work: str, *, driver_memory: str, shuffle_partitions: int) -> None:
        self.specs = specs
        self.root = os.path.abspath(work)
        self.source = os.path.join(self.root, "source")
        os.makedirs(self.source, exist_ok=True)
        write_project(self.root, specs, self.source, driver_memory=driver_memory,
                      shuffle_partitions=shuffle_partitions)
        self._linked = 0

    def add_files(self, files: list[str], tag: str) -> int:
        """Hard-link Delta data files into the source folder (copy if linking is not possible)."""
        from .streaming import link_files

        self._linked = link_files(self.source, files, tag, self._linked)
        return len(files)

    def _table(self, spec) -> str:
        return os.path.join(self.root, "warehouse", spec.name.lower())

    def _parquet(self, folder: str) -> list[str]:
        return sorted(f for f in os.listdir(folder) if f.endswith(".parquet")) if os.path.isdir(folder) else []

    def _rows(self, folder: str) -> int:
        import pyarrow.parquet as pq

        return sum(pq.read_metadata(os.path.join(folder, f)).num_rows for f in self._parquet(folder))

    def run(self, tag: str) -> dict:
        """One `spark-pipelines run`; adds what it did to the tables (rows, files kept from the previous run)."""
        before = {s.name: set(self._parquet(self._table(s))) for s in self.specs}
        out = run_command(self.root, tag)
        after = {s.name: set(self._parquet(self._table(s))) for s in self.specs}
        out["source_rows"] = self._rows(self.source)
        out["table_rows"] = {s.name: self._rows(self._table(s)) for s in self.specs}
        out["files_kept"] = {n: len(after[n] & before[n]) for n in after}
        out["files_written"] = {n: len(after[n] - before[n]) for n in after}
        out["recomputed_whole_table"] = None if not any(before.values()) else (  # None: the first run
            not any(out["files_kept"].values()) and out.get("rows_read", 0) >= len(self.specs) * out["source_rows"]
            and out.get("rows_written", 0) >= sum(out["table_rows"].values()))
        return out

    def answers(self, spark) -> dict:
        """flow -> its materialized view as a DataFrame (the Parquet files of the managed table)."""
        return {s.name: spark.read.parquet(f"file://{self._table(s)}") for s in self.specs}


# --- hooks for bench/run.py --------------------------------------------------------------------


def base_pass(peer: SdpPeer, files: list[str], sampler, label: str) -> dict:
    """The first run, over the base (untimed: the "having processed the base first" part)."""
    peer.add_files(files, "base")
    with sampler.during(f"{label} sdp base"):
        s = peer.run("base")
    sampler.cpu_others_by_phase[f"{label} sdp base"] = s["cpu_others_share"]  # see measure.GroupWatch
    print(f"  {label}: spark-pipelines run over the base in {s['wall_s']:.1f}s (refresh {s['refresh_s']}s)", flush=True)
    return s


def timed_round(peer: SdpPeer, spark, expected: dict[str, str], files: list[str], sampler, label: str, r: int) -> dict:
    """Append Δ's files, time the refresh, check both views against the full recompute (`expected`).
    A failure is returned as `sdp_error` (the other variants' results stand)."""
    from .equality import equal_sinks

    try:
        peer.add_files(files, f"delta{r}")
        with sampler.during(f"{label} sdp"):
            s = peer.run(f"delta{r}")
        sampler.cpu_others_by_phase[f"{label} sdp"] = s["cpu_others_share"]  # see measure.GroupWatch
        eq = equal_sinks(spark, peer.specs, expected, {"sdp": peer.answers(spark)})
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"sdp_error": repr(exc)[:1000]}
    print(f"  {label}: spark-pipelines run after delta in {s['wall_s']:.2f}s (refresh {s['refresh_s']}s, "
          f"whole table recomputed: {s['recomputed_whole_table']})", flush=True)
    return {"t_sdp_s": s["wall_s"], "t_sdp_refresh_s": s["refresh_s"], "sdp": s, "equality_sdp": eq}


# --- for bench/report.py -----------------------------------------------------------------------

VARIANTS = (
    ("t_sdp_refresh_s", "Spark Declarative Pipelines: MV refresh in Spark (start_run)"),
    ("t_sdp_s", "Spark Declarative Pipelines: whole `spark-pipelines run` command"),
)
LIMITS = [
    "a new process per refresh, as `spark-pipelines run` works: a spark-submit JVM, Python, and a second JVM "
    "with a local Spark Connect server; the refresh (start_run) is timed inside it, the command from outside",
    "open-source materialized views are recomputed on every run: the refresh reads every source row and rewrites "
    "the whole table, so its cost grows with the table, not with Δ",
    "file source over hard links to the Delta table's Parquet files (no Delta JVM connector here): like the stream, "
    "it cannot see updates or deletes, so it is timed and checked on the append-only Δ",
    "Hive catalog on an embedded Derby metastore (set in the project's spark-defaults.conf): with the default "
    "in-memory catalog the second run fails with LOCATION_ALREADY_EXISTS",
]


def summarize_into(r: dict) -> None:
    """Headline SDP keys (the t_sdp_* keys come with report.VARIANTS), its ratios to Laminar's batched pass,
    and its errors (prefixed 'sdp', so they fail the run without counting as wrong answers)."""
    from .equality import all_equal

    by = r.get("by_size") or []
    for s in by:
        for e in s.get("sdp_errors") or []:
            if f"sdp B={s['base_rows']:,}: {e}" not in r.setdefault("errors", []):
                r["errors"].append(f"sdp B={s['base_rows']:,}: {e}")
    inc = r.get("t_incremental_batched_s")
    for key, t in (("ratio_sdp_vs_inc_batched", "t_sdp_refresh_s"), ("ratio_sdp_command_vs_inc_batched", "t_sdp_s")):
        r[key] = round(r[t] / inc, 4) if r.get(t) is not None and inc else None
    head = by[-1] if by else {}
    s = head.get("sdp")
    checks = [rd["equality_sdp"]["sdp"] for rd in head.get("rounds") or [] if rd.get("equality_sdp")]
    r["sdp"] = {**{k: s.get(k) for k in ("wall_s", "refresh_s", "phases_s", "spark_jobs", "spark_jobs_s", "task_s",
                                         "rows_read", "source_rows", "rows_written", "table_rows", "files_kept",
                                         "recomputed_whole_table", "cpu_s", "peak_rss_mb", "cpu_others_share",
                                         "round")},
                "results_equal": bool(checks) and all(all_equal(c) for c in checks),
                "measured_separately": head.get("sdp_measured_separately"), "limitations": LIMITS} if s else None
