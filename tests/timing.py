"""Where the suite's time goes, per test file (or shard of a long test): wall seconds and CPU seconds (the test process, its Spark
JVM and every process a test starts), printed at the end of a run and written as JSON for `.ci/run`.

Wall time tells what a developer waits for; CPU time tells what a file costs the machine whatever else
runs beside it (on 2 cores shared by three test processes, a file's wall time moves with its neighbour,
its CPU time hardly). A file past its budget (`FILE_BUDGET_SECONDS` of wall time, docs/testing.md) is
marked in the summary, so growth is visible in the run that caused it; nothing fails on time.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

FILE_BUDGET_SECONDS = 180.0  # wall seconds a test file may take in `make test` (docs/testing.md)
SHOWN = 15
CPU_KEY = "cpu_seconds"


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its live descendants (the Spark JVM, servers a test
    started) and every descendant that ended and was waited for (their time moves to their parent's
    children fields, so nothing is counted twice or lost when a process ends between two readings)."""
    me = os.times()
    total = me.user + me.system + me.children_user + me.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds of its phase (xdist sends user_properties along)."""
    before = getattr(item, "_cpu_before", None)
    outcome = yield
    if before is not None:
        outcome.get_result().user_properties.append((CPU_KEY, max(0.0, tree_cpu_seconds() - before)))
    item._cpu_before = tree_cpu_seconds()  # the next phase starts here


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._cpu_before = tree_cpu_seconds()


def scope(nodeid: str) -> str:
    """What one test process runs without a break: a file, or one shard of a sharded test
    (tests/conftest.py `shards`); budgets and the summary count these units."""
    return nodeid if "[shard-" in nodeid else nodeid.split("::")[0]


class FileTimes:
    """Collected in the controlling process from every test report (xdist workers' included)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()
        self.started_epoch = time.time()
        self.worker_of: dict[str, str] = {}
        self.span: dict[str, list[float]] = {}  # scope -> [first start, last stop], epoch seconds

    def pytest_runtest_logreport(self, report) -> None:
        path = scope(report.nodeid)
        self.wall[path] += report.duration
        self.cpu[path] += sum(v for k, v in report.user_properties if k == CPU_KEY)
        gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's worker, in the controller
        self.worker_of[path] = getattr(gateway, "id", "main")
        start, stop = getattr(report, "start", 0.0) or 0.0, getattr(report, "stop", 0.0) or 0.0
        if start and stop:
            first, last = self.span.get(path, (start, stop))
            self.span[path] = [min(first, start), max(last, stop)]

    def worker_ends(self) -> dict[str, float]:
        """Seconds from the session's start to each test process's last test: the spread is the tail
        where fewer processes than cores had work left."""
        ends: dict[str, float] = {}
        for path, (_, stop) in self.span.items():
            worker = self.worker_of.get(path, "main")
            ends[worker] = max(ends.get(worker, 0.0), stop - self.started_epoch)
        return dict(sorted(ends.items()))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.wall:
            return
        elapsed = time.monotonic() - self.started
        ranked = sorted(self.wall, key=lambda p: -self.wall[p])
        over = [p for p in ranked if self.wall[p] > FILE_BUDGET_SECONDS]
        terminalreporter.section("slowest files")
        terminalreporter.write_line(f"{'wall s':>8} {'cpu s':>8}  file (budget {FILE_BUDGET_SECONDS:.0f} s of wall time each)")
        for path in ranked[:SHOWN]:
            flag = "  OVER BUDGET" if path in over else ""
            terminalreporter.write_line(f"{self.wall[path]:8.1f} {self.cpu[path]:8.1f}  {path}{flag}")
        terminalreporter.write_line(
            f"tests: {elapsed:.0f} s wall; {sum(self.wall.values()):.0f} s in test files, "
            f"{sum(self.cpu.values()):.0f} CPU s; {len(over)} file(s) over budget")
        ends = self.worker_ends()
        if len(ends) > 1:
            terminalreporter.write_line("test processes' last test ended at: "
                                        + ", ".join(f"{w} {t:.0f} s" for w, t in ends.items()))
        if over:
            terminalreporter.write_line("over budget: " + ", ".join(f"{p} ({self.wall[p]:.0f} s)" for p in over),
                                        red=True)
        out = os.environ.get("LAMINAR_TEST_TIMES")
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps({
                "wall_seconds": round(elapsed, 1), "budget_seconds": FILE_BUDGET_SECONDS,
                "worker_ends_seconds": {w: round(t, 1) for w, t in self.worker_ends().items()},
                "files": [{"file": p, "wall_seconds": round(self.wall[p], 1), "cpu_seconds": round(self.cpu[p], 1),
                           "worker": self.worker_of.get(p, "main"),
                           "started_seconds": round(self.span[p][0] - self.started_epoch, 1) if p in self.span else None}
                          for p in ranked]}, indent=1))


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controlling process (or the only one)
        config.pluginmanager.register(FileTimes(), "laminar-file-times")


def print_report(path: str, shown: int = SHOWN) -> None:
    """The summary of a run's JSON (`LAMINAR_TEST_TIMES`), for `.ci/run`'s last lines."""
    data = json.loads(Path(path).read_text())
    budget = data["budget_seconds"]
    files = data["files"]
    over = [f for f in files if f["wall_seconds"] > budget]
    print(f"test phase: {data['wall_seconds']:.0f} s wall; {len(over)} file(s) over the {budget:.0f} s budget")
    ends = data.get("worker_ends_seconds", {})
    if len(ends) > 1:
        print("test processes' last test ended at: " + ", ".join(f"{w} {t:.0f} s" for w, t in ends.items()))
    print(f"{'wall s':>8} {'cpu s':>8}  slowest files")
    for f in files[:shown]:
        flag = "  OVER BUDGET" if f in over else ""
        print(f"{f['wall_seconds']:8.1f} {f['cpu_seconds']:8.1f}  {f['file']}{flag}")


if __name__ == "__main__":
    import sys

    print_report(sys.argv[1])
