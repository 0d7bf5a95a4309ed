"""Warm a new Spark Connect server up with Laminar's own work, on a scratch lake.

A fresh server's JVM loads and compiles Spark's planner, Parquet and shuffle code during its first
queries, which made the first real runs several times slower (docs/PERFORMANCE.md). `laminar serve`
starts this module in a process of its own once the server listens; it sends the demo graph's
passes (a bootstrap, then late rows, corrections and
appends), a contract fetch and an equivalence check through the server, on a throw-away folder,
and exits. Usage: python -m laminar_assets.deploy.warm_up SC_URL
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta


def warm_up(url: str) -> dict[str, float]:
    """Run the warm-up against the server at `url`; returns seconds per phase. Writes only to a
    temporary folder, removed at the end."""
    from laminar_assets.engine import SparkOptions, build_session

    t = time.perf_counter()
    spark = build_session(SparkOptions(remote=url, app_name="laminar-warm-up"))
    seconds = {"connect": time.perf_counter() - t}
    root = tempfile.mkdtemp(prefix=PREFIX)
    try:
        seconds.update(run_stoppable(lambda: exercise(spark, root), cancel=spark.interruptAll))
    finally:
        _ignore_signals()  # no second signal cuts the clean-up short
        _remove(root)  # retried: a task that still wrote a file does not bring the folder back
        spark.stop()
    return seconds


def run_stoppable(work: Callable[[], dict], *, cancel: Callable[[], object], grace: float = 60.0) -> dict:
    """`work()` in a thread of its own; a stop (Ctrl-C, SIGTERM) cancels it with `cancel()` until it
    has ended (at most `grace` seconds), then raises KeyboardInterrupt; its error is raised here.

    The work runs in a thread so that a stop lands in this thread while it only waits: a
    KeyboardInterrupt raised inside a gRPC wait can leave the client's channel locked, and the
    Connect client's exit hook then hangs the process (seen: 1 stop in 12). The wait is on an Event,
    not Thread.join: on Python 3.11 a KeyboardInterrupt inside join() marks a running thread as ended
    (threading's bpo-45274 handling), so the work went on writing while its folder was removed."""
    done = threading.Event()
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread, which raises it
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=target, name="laminar-warm-up", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        _ignore_signals()
        _cancel(cancel, done, grace)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _cancel(cancel: Callable[[], object], done: threading.Event, seconds: float) -> None:
    """Cancel the session's queries until the work stops: the work goes on to its next query after
    a cancelled one only if its error handling does, so cancel again until it has ended."""
    deadline = time.monotonic() + seconds
    while not done.is_set() and time.monotonic() < deadline:
        try:
            cancel()
        except Exception:  # noqa: BLE001 - the server may be gone already; then the work fails on its own
            pass
        done.wait(0.5)


def exercise(spark, root: str) -> dict[str, float]:
    """Laminar's own work on `spark`, in the empty folder `root`: the demo graph's passes (a bootstrap,
    then late rows, corrections and appends), a contract fetch and an equivalence check. Returns
    seconds per phase. Also the workload whose classes make the JVM class archive (class_archive.py)."""
    from laminar_assets.contracts.expectations import validate
    from laminar_assets.demo.generator import BatchOptions, write_batch
    from laminar_assets.engine import Engine, Granularity, partition_key
    from laminar_assets.engine.report import check_equivalence
    from laminar_assets.flows import load_specs
    from laminar_assets.orchestration.builder import specs_with_contracts

    seconds: dict[str, float] = {}
    specs, contracts = specs_with_contracts(load_specs())
    engine = Engine(spark, root)
    batches = [BatchOptions(rows=300, seed=3),  # bootstrap: refills
               BatchOptions(rows=60, seed=3, late_share=0.5, update_share=0.05, delete_share=0.03),
               BatchOptions(rows=40, seed=3, late_share=1.0, update_share=0.0, delete_share=0.0)]  # appends
    keys: set[str] = set()
    for i, options in enumerate(batches):
        t = time.perf_counter()
        summary = write_batch(root, options, batch=i)
        hour = summary.first_time.replace(minute=0, second=0, microsecond=0)
        while hour <= summary.last_time:  # every hour the batch wrote to
            keys.add(partition_key(hour, Granularity.HOURLY))
            hour += timedelta(hours=1)
        for spec in specs:
            engine.run_many(spec, sorted(keys))
        seconds[f"batch {i}"] = time.perf_counter() - t
    t = time.perf_counter()
    flow = next(s for s in specs if s.recompute_checked)  # a spec the equivalence check compares
    check_equivalence(engine, flow, min(keys), sample=4)
    stage = specs[0]
    if stage.sink in contracts:
        validate(engine.sink_frame(stage, min(keys)), contracts[stage.sink])
    seconds["checks"] = time.perf_counter() - t
    return seconds


PREFIX = "laminar-warm-up-"


def _remove(folder: str, attempts: int = 5) -> None:
    for _ in range(attempts):
        shutil.rmtree(folder, ignore_errors=True)
        time.sleep(0.5)
        if not os.path.exists(folder):
            return


def sweep_stale(hours: float = 6.0) -> None:
    """Remove scratch folders of warm-ups that were killed (SIGKILL leaves no chance to clean up)."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        path = os.path.join(tmp, name)
        if name.startswith(PREFIX) and time.time() - os.path.getmtime(path) > hours * 3600:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m laminar_assets.deploy.warm_up SC_URL", file=sys.stderr)
        return 2
    os.environ.pop("LAMINAR_SPARK_REMOTE", None)
    # `laminar serve` stops this process with SIGINT, then SIGTERM: both raise KeyboardInterrupt, which
    # the Spark Connect client turns into a cancel of the running query; `finally` removes the folder
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sweep_stale()
    t = time.perf_counter()
    try:
        seconds = warm_up(argv[0])
    except KeyboardInterrupt:
        print("warm-up stopped", flush=True)
        return 130
    print(f"warm-up done in {time.perf_counter() - t:.1f} s: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
