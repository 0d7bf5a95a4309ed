"""One run of `spark-pipelines run` for the SDP peer (bench/sdp_peer.py): the command in its own
process group with the project's SPARK_CONF_DIR, never left running, and the phases, Spark jobs and
rows of its refresh read from the Spark event log it wrote."""

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

from .measure import GroupWatch

CONNECT_PORT = 15002  # the local Connect server `spark-pipelines` starts always binds this port
TIMEOUT_S = 1800
PORT_WAIT_S = 900


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
