"""Six runs back to back through the warm run launcher (dagster.yaml's), each launched as soon as the previous
one ended and a warm worker is ready: seconds from the previous run's end to this one's SUCCESS (a wait for a
warm worker included), and the CPU seconds of every process under this one meanwhile (sampled every 0.2 s).
A tiny probe job (tests/orchestration/internals/test_run_launcher.py), so what is measured is the launch path.

    python -m bench.warm_launcher        (docs/PERFORMANCE.md, "Warm run workers that fork")
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import dagster as dg
import psutil

from tests.orchestration.internals.test_run_launcher import _finished, _open, _run, _warm

RUNS = 6


def _cpu_of_children() -> dict[tuple[int, float], float]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            out[(p.pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            continue
    return out


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="laminar-launcher-bench-"))
    with _open(folder) as instance:
        launcher = _warm(instance)
        deadline = time.monotonic() + 120
        while launcher.idle_workers() < launcher.warm_workers and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
        before, seen, done = _cpu_of_children(), {}, threading.Event()

        def sample() -> None:
            while not done.is_set():
                seen.update(_cpu_of_children())
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        seconds = []
        for i in range(RUNS):
            run = _run(instance, folder, folder / f"probe{i}.json")
            started = time.perf_counter()
            while launcher.idle_workers() < 1 and time.perf_counter() - started < 60:
                time.sleep(0.05)  # a worker that executed a run used to warm up again first
            instance.launch_run(run.run_id, workspace=None)
            assert _finished(instance, run.run_id).status == dg.DagsterRunStatus.SUCCESS
            seconds.append(round(time.perf_counter() - started, 2))
        time.sleep(8)  # a worker warming up after the last run is counted too
        done.set()
        sampler.join()
        launcher.dispose()
    cpu = sum(v - before.get(k, 0.0) for k, v in seen.items())
    print(json.dumps({"run_seconds": seconds, "children_cpu_s": round(cpu, 1)}))


if __name__ == "__main__":
    main()
