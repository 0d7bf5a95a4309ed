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

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from .measure import GroupWatch
from .sdp_project import write_project

if TYPE_CHECKING:
    from laminar_assets.engine import FlowSpec

CONNECT_PORT = 15002  # the local Connect server `spark-pipelines` starts always binds this port
TIMEOUT_S = 1800
PORT_WAIT_S = 900


# --- one run of the command -------------------------------------------------------------------


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop whatever is left of the command's process group (spark-submit JVM, Python, Connect server JVM)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        for _ in range(30):
            proc.poll()  # reap the leader: a zombie still belongs to the group
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def _env(root: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_GATEWAY", "PYSPARK_REMOTE_INIT_CONF", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE",
                                "SPARK_CONNECT_MODE", "SPARK_API_MODE", "SPARK_CONF_DIR", "SPARK_LOCAL_CONNECT"))}
    bin_dir = os.path.dirname(sys.executable)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_CONF_DIR=f"{root}/conf",
               PATH=bin_dir + os.pathsep + env.get("PATH", ""))
    return env


def run_command(root: str, tag: str, timeout_s: float = TIMEOUT_S) -> dict:
    """`spark-pipelines run` in `root`; returns wall time, return code, flow states and the event log's numbers."""
    cli = os.path.join(os.path.dirname(sys.executable), "spark-pipelines")
    cli = cli if os.path.exists(cli) else shutil.which("spark-pipelines") or "spark-pipelines"
    waited = time.perf_counter()
    while _port_in_use(CONNECT_PORT):  # another Connect server: ours could not bind, its client would use that one
        if time.perf_counter() - waited > PORT_WAIT_S:
            raise RuntimeError(f"port {CONNECT_PORT} stayed taken for {PORT_WAIT_S} s: spark-pipelines' local "
                               "Connect server needs it")
        print(f"  sdp: waiting for port {CONNECT_PORT} (taken by another process)", flush=True)
        time.sleep(15)
    events = os.path.join(root, "events")
    before = set(os.listdir(events))
    log = os.path.join(root, f"run-{tag}.log")
    t = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen([cli, "--remote", "local[2]", "run"], cwd=root, env=_env(root), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        watch = GroupWatch(proc.pid)
        try:
            while True:
                watch.sample()
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if time.perf_counter() - t > timeout_s:
                        raise
            wall = time.perf_counter() - t
            watch.sample()  # the server JVM may still be exiting
            usage = watch.result()
        finally:
            _kill_group(proc)  # on a timeout or an interrupt too: nothing may linger (e.g. the server JVM)
    with open(log, errors="replace") as fh:
        text = fh.read()
    flows = {name.replace("`", "").rsplit(".", 1)[-1]: state
             for name, state in re.findall(r"Flow '?([\w.`]+)'? has (COMPLETED|FAILED)", text)}
    new = sorted(set(os.listdir(events)) - before)
    out = {"wall_s": round(wall, 4), "returncode": rc, "flows": flows, "log": log, **usage,
           **(parse_event_log(os.path.join(events, new[-1])) if new else {"event_log": None, "phases_s": {}})}
    if out.get("app_s") is not None:  # spark-submit's JVM, Python, the server JVM until the app starts; exit
        out["phases_s"] = {"launch_and_exit": round(wall - out["app_s"], 3), **out["phases_s"]}
    if rc != 0 or "Run is COMPLETED" not in text:
        tail = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("\tat ")][-6:]
        raise RuntimeError(f"spark-pipelines run exited {rc}: " + " | ".join(tail)[-800:])
    return out


def parse_event_log(path: str) -> dict:
    """The refresh's numbers from a Spark event log (a file, or a rolling-log folder): the phases of the
    Spark application (the `start_run` pipeline command is the refresh), its Spark jobs, its tasks' rows."""
    files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.startswith("events_")] \
        if os.path.isdir(path) else [path]
    app, ops, jobs, stage_job, tasks = {}, {}, {}, {}, []
    for name in files:
        with open(name, errors="replace") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                kind = e.get("Event", "").rsplit(".", 1)[-1]
                if kind in ("SparkListenerApplicationStart", "SparkListenerApplicationEnd"):
                    app[kind[24:]] = e["Timestamp"]  # Start | End
                elif kind == "SparkListenerConnectOperationStarted":
                    m = re.match(r"\s*pipeline_command \{\s*(\w+)", e.get("statementText", ""))
                    ops[e["operationId"]] = {"command": m.group(1) if m else "", "start": int(e["eventTime"])}
                elif kind == "SparkListenerConnectOperationFinished" and e["operationId"] in ops:
                    ops[e["operationId"]]["end"] = int(e["eventTime"])
                elif kind == "SparkListenerJobStart":
                    jobs[e["Job ID"]] = [e["Submission Time"], None, e.get("Properties", {}).get("spark.job.tags", "")]
                    stage_job.update({st: e["Job ID"] for st in e.get("Stage IDs", [])})
                elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
                    jobs[e["Job ID"]][1] = e["Completion Time"]
                elif kind == "SparkListenerTaskEnd":
                    tasks.append((e["Stage ID"], e.get("Task Metrics") or {}))
    run_id, run = next(((i, o) for i, o in ops.items() if o["command"] == "start_run"), (None, {}))
    graph = next((o for o in ops.values() if o["command"] == "create_dataflow_graph"), {})
    mine = {j for j, (_, end, tags) in jobs.items() if run_id and f"Operation_{run_id}" in tags and end}
    busy, cursor = 0, 0
    for a, b in sorted(jobs[j][:2] for j in mine):  # the union of the jobs' intervals
        busy, cursor = busy + max(b - max(a, cursor), 0), max(b, cursor)
    metrics = [tm for st, tm in tasks if stage_job.get(st) in mine]
    total = lambda group, key: sum(int((tm.get(group) or {}).get(key, 0)) for tm in metrics)  # noqa: E731
    sec = lambda a, b: round((b - a) / 1000, 3) if a and b else None  # noqa: E731
    return {
        "event_log": path, "refresh_s": sec(run.get("start"), run.get("end")),
        "app_s": sec(app.get("Start"), app.get("End")),
        "phases_s": {"session": sec(app.get("Start"), graph.get("start")),  # SparkContext, Connect server, session
                     "graph": sec(graph.get("start"), run.get("start")),  # dataflow graph, metastore, definitions
                     "refresh": sec(run.get("start"), run.get("end")),
                     "after": sec(run.get("end"), app.get("End"))},
        "spark_jobs": len(mine), "spark_jobs_s": round(busy / 1000, 3),
        "task_s": round(sum(int(tm.get("Executor Run Time", 0)) for tm in metrics) / 1000, 3),
        "rows_read": total("Input Metrics", "Records Read"), "bytes_read": total("Input Metrics", "Bytes Read"),
        "rows_written": total("Output Metrics", "Records Written"),
        "bytes_written": total("Output Metrics", "Bytes Written"),
    }


# --- the peer ----------------------------------------------------------------------------------


class SdpPeer:
    """One SDP project under `work` (see the module docstring): a materialized view per flow."""

    def __init__(self, specs: list["FlowSpec"], work: str, *, driver_memory: str, shuffle_partitions: int) -> None:
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
