"""Freshness through the real deployment: `laminar serve` (Spark Connect + dagster dev with the daemon),
sensors at their default interval, commits to `raw_trades` of the project's own pipeline.

    python -m bench.daemon_freshness [--commits 10] [--local-spark] [--s3-latency-ms 20]
                                     [--out bench/results/daemon_freshness.json]

For each commit: wall time from the commit (write_deltalake returned) until every partition of every
asset it touches has a watermark at the new versions (all sinks updated; the run's contract and
equivalence checks still run after that, reported apart as until_checks_done); and until the Postgres
table of the pipeline's export `vwap_1m_pg` reflects it (`postgres_*`: its delivered version in
`laminar_exports` reached the version of `vwap_1m` that holds the commit; the export is a step of the same
run, after its flow). That Postgres is the one `laminar serve` embeds for a connection nothing defines
(pgserver on a Unix socket, in `<work>/embedded/lake/postgres`), as `make ui` runs it; at the end its table is
checked row for row against `vwap_1m` at the delivered version.
Each launched run's time splits into launch overhead (queued -> run worker started: process start,
imports, loading the definitions), Spark session (connecting to the Connect server, or starting a JVM
with --local-spark) and engine time (the assets' own seconds), from the Dagster instance's records.
Commits arrive 0.5-1.5 sensor intervals after the previous run has finished.

With --s3-latency-ms MS the lake lives in a bucket of a local S3 server (moto on 127.0.0.1,
laminar_assets.deploy.local_s3) that sleeps MS before every request (20: S3's first-byte latency in
its region): `laminar serve`, its runs and this process reach it through LAMINAR_ROOT and the AWS
variables, as `python -m laminar_assets.deploy.local_store s3 -- laminar serve` points them. This process
polls the lake through the same server, so each poll pays the latency too (`mean_poll_s`: how long
one poll took, the resolution of the samples).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _caught_up(component, root: str, instance, *, runs_done: bool = True) -> bool:
    """Every sink updated: no partition's watermark behind a commit that touched it (state and sink
    commit before the watermark moves). `runs_done`: also wait for the run's checks to finish."""
    import dagster as dg

    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.orchestration.sensors import ACTIVE
    from laminar_assets.pipeline.tick import Cursor, plan_tick

    if runs_done and instance.get_run_ids(dg.RunsFilter(statuses=ACTIVE), limit=1):
        return False
    return plan_tick(component, root, CheckpointStore(root), Cursor(), lambda *_: set(), set()).empty


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


class _Delivered:
    """The delivered version of the export `vwap_1m_pg` in the Postgres that `laminar serve` embeds (found by its
    postmaster.pid once it runs) and the version of its source table, `vwap_1m`."""

    EXPORT = "vwap_1m_pg"

    def __init__(self, work: str, root: str) -> None:
        from laminar_assets import storage
        from laminar_assets.deploy.embedded_targets import embedded_folder

        # where `laminar serve --log-dir <work>/logs` keeps its embedded targets, for a local lake or a bucket
        self.pgdata = os.path.join(embedded_folder(root, machine_folder=work), "postgres")
        self.sink = storage.join(root, "vwap_1m")
        self._conn = None

    def url(self) -> str:
        with open(os.path.join(self.pgdata, "postmaster.pid")) as fh:
            socket_dir = fh.read().splitlines()[4]  # postmaster.pid's fifth line: the socket directory
        return f"postgresql://postgres@/analytics?host={socket_dir}"

    def version(self) -> int:
        """The export's delivered version (-1: none yet)."""
        import psycopg

        if self._conn is None:
            self._conn = psycopg.connect(self.url(), autocommit=True)
        if not self._conn.execute("SELECT to_regclass('public.laminar_exports') IS NOT NULL").fetchone()[0]:
            return -1
        row = self._conn.execute("SELECT delivered_version FROM laminar_exports WHERE export = %s",
                                 (self.EXPORT,)).fetchone()
        return int(row[0]) if row else -1

    def _table(self, version: int | None = None):
        from deltalake import DeltaTable

        from laminar_assets import storage

        return DeltaTable(self.sink, version=version, storage_options=storage.delta_options(self.sink))

    def sink_version(self) -> int:
        return self._table().version()

    def check(self) -> dict:
        """The Postgres table against `vwap_1m` at the delivered version: every row, in key order."""
        from laminar_assets.engine.delta.arrow_reads import read_arrow

        version = self.version()
        table = self._table(version)
        names = [f.name for f in table.schema().fields]
        want = sorted(tuple(r[n] for n in names) for r in read_arrow(self.sink, table).to_pylist())
        got = sorted(self._conn.execute(f"SELECT {', '.join(names)} FROM vwap_1m").fetchall())
        return {"delivered_version": version, "rows_delta": len(want), "rows_postgres": len(got), "equal": want == got}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _steps(instance, run_id: str, start: float) -> dict[str, list[float]]:
    """Each step's [start offset from the run's start, seconds], from the run's event log."""
    out: dict[str, list[float]] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or not entry.step_key:
            continue
        kind = event.event_type_value
        if kind == "STEP_START":
            out[entry.step_key] = [round(entry.timestamp - start, 3), 0.0]
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and entry.step_key in out:
            out[entry.step_key][1] = round(entry.timestamp - start - out[entry.step_key][0], 3)
    return out


def _mean_steps(runs: list[dict]) -> dict[str, list[float]]:
    """A typical run's timeline: each step's mean [start offset, seconds], in start order."""
    by_step: dict[str, list[list[float]]] = {}
    for r in runs:
        for step, (start, seconds) in r.get("steps", {}).items():
            by_step.setdefault(step, []).append([start, seconds])
    means = {k: [round(float(np.mean([v[0] for v in vs])), 2), round(float(np.mean([v[1] for v in vs])), 2)]
             for k, vs in by_step.items()}
    return dict(sorted(means.items(), key=lambda kv: kv[1][0]))


def _run_breakdown(instance, run_ids: list[str], assets: list[str]) -> list[dict]:
    import dagster as dg

    out = []
    for run_id in run_ids:
        stats = instance.get_run_stats(run_id)
        engine_s = session_s = 0.0
        for key in assets:
            recs = [r for r in instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(key)), limit=200).records if r.run_id == run_id]
            if recs:
                md = recs[0].asset_materialization.metadata
                engine_s += float(md["seconds_total"].value) if "seconds_total" in md else 0.0
                session_s = max(session_s, float(md["seconds_spark_session"].value)
                                if "seconds_spark_session" in md else 0.0)
        out.append({"run_id": run_id, "status": str(instance.get_run_by_id(run_id).status.value),
                    "queue_wait_s": round((stats.launch_time or 0) - (stats.enqueued_time or 0), 3),
                    "launch_overhead_s": round((stats.start_time or 0) - (stats.launch_time or 0), 3),
                    "run_s": round((stats.end_time or 0) - (stats.start_time or 0), 3),
                    "spark_session_s": round(session_s, 3), "engine_s": round(engine_s, 3),
                    "steps": _steps(instance, run_id, stats.start_time or 0)})
    return out


def measure(commits: int, *, local_spark: bool, rows: int, seed: int, cold_launch: bool = False,
            s3_latency_ms: float | None = None) -> dict:
    """See the module docstring; `s3_latency_ms` None: the lake on local disk, else in a bucket of a local S3
    server at that latency."""
    work = tempfile.mkdtemp(prefix="laminar-daemon-bench-")
    if s3_latency_ms is None:
        return _measure(commits, work, os.path.join(work, "lake"), {}, local_spark=local_spark, rows=rows, seed=seed,
                        cold_launch=cold_launch)
    from laminar_assets import storage
    from laminar_assets.deploy.local_s3 import LocalS3

    with LocalS3(log=os.path.join(work, "moto.log"), latency_ms=s3_latency_ms) as server, \
            storage.mounted("s3://", server.options):  # this process's writes and polls go to the bucket too
        root = f"{server.create_bucket('laminar-daemon-bench')}/lake"
        result = _measure(commits, work, root, server.options.as_env(), local_spark=local_spark, rows=rows,
                          seed=seed, cold_launch=cold_launch)
    return {**result, "store": f"local S3 server (moto, 127.0.0.1), {s3_latency_ms:g} ms per request",
            "s3_latency_ms": s3_latency_ms}


def _measure(commits: int, work: str, root: str, store_env: dict[str, str], *, local_spark: bool, rows: int, seed: int,
             cold_launch: bool) -> dict:
    import dagster as dg

    from laminar_assets.definitions import specs_with_contracts
    from laminar_assets.demo.generator import BatchOptions, append_trades, recent_start, write_batch
    from laminar_assets.flows import load_specs
    from laminar_assets.pipeline.graph import components
    from laminar_assets.pipeline.settings import load_settings

    [component] = components(specs_with_contracts(load_specs())[0])
    interval = float(load_settings().sensor_interval_seconds)
    from laminar_assets.orchestration.internals.instance import SENSOR_LOOP_SECONDS

    loop = max(float(SENSOR_LOOP_SECONDS), interval)  # the Laminar instance's sensor daemon loop
    home = os.path.join(work, "dagster_home")
    os.makedirs(home)
    with open(os.path.join(REPO, "dagster.yaml")) as fh:
        instance_yaml = fh.read()
    if cold_launch:  # every run through the code server in a new process, as with Dagster's default launcher
        assert "warm_workers: 2" in instance_yaml, "dagster.yaml no longer sets warm_workers: 2"
        instance_yaml = instance_yaml.replace("warm_workers: 2", "warm_workers: 0")
    with open(os.path.join(home, "dagster.yaml"), "w") as fh:
        fh.write(instance_yaml)
    env = {k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"}
    env.update(store_env, DAGSTER_HOME=home, LAMINAR_ROOT=root)
    ui = _free_port()
    cmd = [sys.executable, "-m", "laminar_assets.cli", "--root", root, "serve", "--ui-port", str(ui),
           "--spark-port", str(_free_port()), "--log-dir", os.path.join(work, "logs"),
           *(["--local-spark"] if local_spark else [])]
    log = open(os.path.join(work, "serve.log"), "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rng = np.random.default_rng(seed)
    samples, with_checks, runs_per_commit, errors, to_created = [], [], [], [], []
    pg_samples, pg_check, polls = [], None, []
    delivered = _Delivered(work, root)
    try:
        from laminar_assets.deploy.connect_server import port_in_use

        if not _wait(lambda: port_in_use("127.0.0.1", ui), 300):
            raise RuntimeError(f"laminar serve did not start; see {work}/serve.log")
        warm_up_s = None
        if not local_spark:  # serve warms its new Connect server up; commits land once that is done
            t = time.monotonic()
            warm_log = os.path.join(work, "logs", "warm-up.log")
            if not _wait(lambda: os.path.exists(warm_log) and any(s in open(warm_log).read()
                                                                  for s in ("warm-up done", "Traceback")), 300) \
                    or "Traceback" in open(warm_log).read():
                raise RuntimeError(f"the Connect server's warm-up did not finish; see {warm_log}")
            warm_up_s = time.monotonic() - t
        instance = dg.DagsterInstance.from_config(home)
        # recent data, as `laminar demo` writes: the project's partitions start two days back
        summary = write_batch(root, BatchOptions(rows=rows, seed=seed, start=recent_start()), batch=0)
        t = time.monotonic()
        if not _wait(lambda: _caught_up(component, root, instance) and instance.get_run_ids(), 900):
            raise RuntimeError("the first batch did not reach the sinks within 15 min")
        bootstrap_s = time.monotonic() - t
        if not _wait(lambda: delivered.version() >= delivered.sink_version(), 300):
            raise RuntimeError("the first batch's vwap_1m did not reach Postgres within 5 min")
        tip = summary.last_time
        for i in range(commits):
            time.sleep(float(rng.uniform(0.5, 1.5)) * loop)  # a random moment relative to the daemon's loop
            before = set(instance.get_run_ids())
            sink_before = delivered.sink_version()
            at = time.monotonic()
            append_trades(root, max(rows // 20, 20), tip - timedelta(minutes=5), tip, seed=seed + i)
            committed = time.time()  # wall clock, as the instance's run records
            first_delivery: list[tuple[float, int]] = []  # (seconds, version): the first delivery of a newer vwap_1m

            def fresh() -> bool:
                t = time.monotonic()
                try:
                    if not first_delivery and delivered.version() > sink_before:  # noqa: B023  (waited for at once)
                        first_delivery.append((time.monotonic() - at, delivered.version()))  # noqa: B023
                    return bool(set(instance.get_run_ids()) - before  # noqa: B023
                                and _caught_up(component, root, instance, runs_done=False))
                finally:
                    polls.append(time.monotonic() - t)  # how long one poll takes: the samples' resolution

            # fresh: a run picked the commit up and every sink it touches is updated (checks may still run)
            if not _wait(fresh, 600):
                errors.append(f"commit {i} not fresh within 10 min")
                continue
            samples.append(time.monotonic() - at)
            final = delivered.sink_version()  # vwap_1m holds the commit from this version on
            if first_delivery and first_delivery[0][1] >= final:  # delivered before every other sink was done
                pg_samples.append(first_delivery[0][0])
            elif _wait(lambda: delivered.version() >= final, 600):  # noqa: B023
                pg_samples.append(time.monotonic() - at)
            else:
                errors.append(f"commit {i}: vwap_1m version {final} not in Postgres within 10 min")
            _wait(lambda: _caught_up(component, root, instance), 600)  # the run's checks, before the next commit
            with_checks.append(time.monotonic() - at)
            runs_per_commit.append(sorted(set(instance.get_run_ids()) - before))
            created = [instance.get_run_record_by_id(r).create_timestamp.timestamp() for r in runs_per_commit[-1]]
            if created:  # the sensor's part: its tick seeing the commit, planning, the run's creation
                to_created.append(min(created) - committed)
            tip += timedelta(minutes=1)
        breakdown = _run_breakdown(instance, [r for rs in runs_per_commit for r in rs], [s.name for s in component.specs])
        pg_check = delivered.check()
        if not pg_check["equal"]:
            errors.append(f"the Postgres table vwap_1m differs from the Delta table: {pg_check}")
    finally:
        delivered.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()

    def pct(q):
        return round(float(np.percentile(samples, q)), 2) if samples else None

    def mean(key):
        vals = [b[key] for b in breakdown]
        return round(float(np.mean(vals)), 2) if vals else None

    return {"store": "local disk",
            "spark": "one JVM per run (--local-spark)" if local_spark else "Spark Connect server (laminar serve)",
            "sensor_interval_s": interval, "commits": commits, "commit_rows": max(rows // 20, 20),
            "warm_up_s": round(warm_up_s, 1) if warm_up_s is not None else None,
            "bootstrap_s": round(bootstrap_s, 1), "samples_s": [round(s, 2) for s in samples],
            "p50_s": pct(50), "p95_s": pct(95),
            "postgres_samples_s": [round(x, 2) for x in pg_samples],
            "postgres_p50_s": round(float(np.percentile(pg_samples, 50)), 2) if pg_samples else None,
            "postgres_p95_s": round(float(np.percentile(pg_samples, 95)), 2) if pg_samples else None,
            "postgres_check": pg_check,
            "mean_poll_s": round(float(np.mean(polls)), 3) if polls else None,
            "mean_commit_to_run_created_s": round(float(np.mean(to_created)), 2) if to_created else None,
            "until_checks_done_p50_s": round(float(np.percentile(with_checks, 50)), 2) if with_checks else None,
            "runs_per_commit": [len(r) for r in runs_per_commit],
            "mean_queue_wait_s": mean("queue_wait_s"), "mean_launch_overhead_s": mean("launch_overhead_s"),
            "mean_spark_session_s": mean("spark_session_s"),
            "mean_engine_s": mean("engine_s"), "mean_run_s": mean("run_s"),
            "mean_steps_s": _mean_steps(breakdown[1:] or breakdown),
            "failed_runs": sum(b["status"] != "SUCCESS" for b in breakdown), "runs": breakdown, "errors": errors,
            "work": work}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1000, help="rows of the first batch; each commit is 1/20")
    parser.add_argument("--local-spark", action="store_true")
    parser.add_argument("--cold-launch", action="store_true",
                        help="no warm run workers (warm_workers: 0): every run starts a new process")
    parser.add_argument("--s3-latency-ms", type=float, metavar="MS",
                        help="the lake in a bucket of a local S3 server sleeping MS before each request (e.g. 20)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "daemon_freshness.json"))
    args = parser.parse_args()
    if args.s3_latency_ms is not None and not args.s3_latency_ms >= 0:
        parser.error(f"--s3-latency-ms must be 0 or more, not {args.s3_latency_ms}")
    result = measure(args.commits, local_spark=args.local_spark, rows=args.rows, seed=args.seed,
                     cold_launch=args.cold_launch, s3_latency_ms=args.s3_latency_ms)
    existing = json.load(open(args.out)) if os.path.exists(args.out) else {}
    key = ("local_spark" if args.local_spark else "connect") + ("_cold_launch" if args.cold_launch else "")
    if args.s3_latency_ms is not None:
        key += f"_s3_{args.s3_latency_ms:g}ms"
    existing[key] = result
    with open(args.out, "w") as fh:
        json.dump(existing, fh, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
