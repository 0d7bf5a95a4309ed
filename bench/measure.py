"""Measuring: wall time, Spark jobs per phase, memory of the driver and the Spark JVM, machine load.

Memory is read from Linux `/proc`: `VmRSS` (now) and `VmHWM` (the kernel's peak resident set) of
this Python process and of its descendants (in local mode the Spark JVM is a child of Python).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])  # kB
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid`, from the parent ids in /proc/<pid>/stat."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command may contain spaces and parentheses: the ppid follows the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        parents[int(name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == current]
        out.extend(kids)
        frontier.extend(kids)
    return out


def process_group(pid: int) -> int | None:
    """The process group: commands the bench starts in their own group (`spark-pipelines run`) are not
    its Spark JVM (bench/sdp_peer.py measures them)."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode(errors="replace").rsplit("/", 1)[-1]
    except OSError:
        return "?"


def _machine_busy_ticks() -> int:
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return f[0] + f[1] + f[2] + sum(f[5:8])  # user nice system irq softirq steal


def _own_ticks(me: int) -> int:
    total = 0
    for pid in [me, *descendants(me)]:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total


class CpuOthers:
    """Share of the machine's CPU capacity that other processes used between `start()` and `stop()`:
    busy ticks of the whole machine (/proc/stat) minus those of this process tree."""

    def start(self) -> CpuOthers:
        self.t = time.perf_counter()
        self.busy, self.own = _machine_busy_ticks(), _own_ticks(os.getpid())
        return self

    def stop(self) -> float | None:
        wall = time.perf_counter() - self.t
        hz = os.sysconf("SC_CLK_TCK")
        other = (_machine_busy_ticks() - self.busy) - (_own_ticks(os.getpid()) - self.own)
        if wall <= 0:
            return None
        return round(max(other, 0) / hz / (wall * (os.cpu_count() or 1)), 3)


class GroupWatch:
    """CPU and memory of a command the bench runs in its own process group (`spark-pipelines run`), polled
    (a JVM it starts outlives its parent, so its CPU never reaches the bench's `cutime`), and the share of
    the machine's CPU that everything else used meanwhile (the bench's own processes do not count)."""

    def __init__(self, pgid: int) -> None:
        self.pgid, self.ticks, self.hwm_kb = pgid, {}, {}
        self.t, self.busy, self.mine = time.perf_counter(), _machine_busy_ticks(), self._mine()

    @staticmethod
    def _stat(pid: int | str) -> tuple[int, int] | None:
        """(process group, utime + stime) of a process, None if it is gone."""
        try:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read()
        except OSError:
            return None
        f = f[f.rfind(")") + 2:].split()
        return int(f[2]), int(f[11]) + int(f[12])

    def _mine(self) -> int:
        me = os.getpid()
        return sum(st[1] for st in map(self._stat, [me, *descendants(me)]) if st and st[0] != self.pgid)

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            st = self._stat(name) if name.isdigit() else None
            if st and st[0] == self.pgid:
                self.ticks[name] = max(self.ticks.get(name, 0), st[1])
                self.hwm_kb[name] = max(self.hwm_kb.get(name, 0), _status(int(name)).get("VmHWM", 0))

    def result(self) -> dict:
        wall, hz = time.perf_counter() - self.t, os.sysconf("SC_CLK_TCK")
        group = sum(self.ticks.values())
        others = (_machine_busy_ticks() - self.busy) - (self._mine() - self.mine) - group
        return {"cpu_s": round(group / hz, 2), "peak_rss_mb": round(sum(self.hwm_kb.values()) / 1024, 1),
                "cpu_others_share": round(max(others, 0) / hz / (wall * (os.cpu_count() or 1)), 3) if wall else None}


@dataclass
class MemorySampler:
    """Samples resident memory every `interval` seconds in a thread: this Python process (the driver)
    plus the Spark JVM (its largest `java` descendant in its process group; in local mode Spark runs there).

    Short-lived helpers (PySpark's Python workers, `chmod` forked by Hadoop, `jspawnhelper`) are
    left out of the totals: a child that has been forked but not yet exec'd reports its parent's
    pages, which would double-count. `phase` names what the main thread is doing; the per-phase
    peak of the simultaneous total and the 1-minute load average at the end of each phase are kept.
    `report()` adds the kernel's own per-process peaks (VmHWM), which catch spikes between samples.
    """

    interval: float = 0.25
    phase: str = "setup"
    peak_total_kb: int = 0
    peaks_by_phase: dict[str, int] = field(default_factory=dict)
    load_by_phase: dict[str, float] = field(default_factory=dict)
    cpu_others_by_phase: dict[str, float | None] = field(default_factory=dict)
    hwm_kb: dict[str, int] = field(default_factory=dict)
    # The JVM's own account at each phase's end (`jvm_memory`): heap used (live and garbage not yet
    # collected) and committed, non-heap committed (classes, compiled code); what RSS holds beyond them is
    # native (threads, buffers, RocksDB). Set `spark` to read it; None: not read.
    spark: object | None = None
    jvm_by_phase: dict[str, dict[str, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        me = os.getpid()
        mine = _status(me)
        group = os.getpgid(0)
        jvms = [(_status(pid), pid) for pid in descendants(me) if command_of(pid) == "java" and process_group(pid) == group]
        jvm = max(jvms, key=lambda x: x[0].get("VmRSS", 0), default=({}, None))[0]
        total = mine.get("VmRSS", 0) + jvm.get("VmRSS", 0)
        self.hwm_kb["python_driver"] = max(self.hwm_kb.get("python_driver", 0), mine.get("VmHWM", 0))
        self.hwm_kb["spark_jvm"] = max(self.hwm_kb.get("spark_jvm", 0), jvm.get("VmHWM", 0))
        self.peak_total_kb = max(self.peak_total_kb, total)
        self.peaks_by_phase[self.phase] = max(self.peaks_by_phase.get(self.phase, 0), total)

    @contextmanager
    def during(self, phase: str):
        previous, self.phase = self.phase, phase
        others = CpuOthers().start()
        try:
            yield
        finally:
            self.cpu_others_by_phase[phase] = others.stop()
            self.sample()
            if self.spark is not None:
                try:
                    self.jvm_by_phase[phase] = jvm_memory(self.spark)
                except Exception as exc:  # noqa: BLE001  (a number of the report, never the run's failure)
                    self.jvm_by_phase[phase] = {"error": repr(exc)[:200]}
            self.load_by_phase[phase] = round(os.getloadavg()[0], 2)
            self.phase = previous

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.phase = "end"
        self.sample()

    def report(self) -> dict:
        mb = lambda kb: round(kb / 1024, 1)  # noqa: E731
        by_process = {k: mb(v) for k, v in self.hwm_kb.items()}
        return {
            "peak_rss_mb": round(sum(by_process.values()), 1),
            "peak_rss_by_process_mb": by_process,
            "peak_rss_sampled_total_mb": mb(self.peak_total_kb),
            "peak_rss_sampled_by_phase_mb": {k: mb(v) for k, v in self.peaks_by_phase.items()},
            "load_avg_1m_by_phase": dict(self.load_by_phase),
            "jvm_at_phase_end_mb": dict(self.jvm_by_phase),
            "peak_jvm_heap_used_mb": max((v.get("heap_used_mb", 0) for v in self.jvm_by_phase.values()), default=None),
            "cpu_used_by_other_processes_by_phase": dict(self.cpu_others_by_phase),
            "peak_rss_measured": "peak_rss_mb = the Python driver's peak RSS + the Spark JVM's peak RSS (each the "
                                 "kernel's VmHWM from /proc; the JVM is Python's child in local mode), an upper bound "
                                 "on their simultaneous use; peak_rss_sampled_total_mb = the largest simultaneous "
                                 "sum of the two VmRSS seen by a 4 Hz sampler",
        }


def jvm_memory(spark, *, collect: bool = False) -> dict[str, float]:
    """The Spark JVM's heap used and committed and its non-heap committed, in MB (`java.lang.management`);
    `collect`: after a full GC first, so that heap used is what is still referenced (the live set)."""
    jvm = spark.sparkContext._jvm
    if collect:
        jvm.java.lang.System.gc()
    bean = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    heap, other = bean.getHeapMemoryUsage(), bean.getNonHeapMemoryUsage()
    mb = lambda n: round(n / 2**20, 1)  # noqa: E731
    return {"heap_used_mb": mb(heap.getUsed()), "heap_committed_mb": mb(heap.getCommitted()),
            "heap_max_mb": mb(heap.getMax()), "non_heap_committed_mb": mb(other.getCommitted())}


class JobCounter:
    """Counts Spark jobs between two points, whatever thread ran them (streaming included).

    Job ids are sequential per SparkContext; a one-task marker job before and after a phase
    brackets the ids the phase used. Markers run outside the timed code.
    """

    def __init__(self, spark) -> None:
        self.sc = spark.sparkContext

    def marker(self) -> int:
        self.sc.setJobGroup("bench-marker", "bench marker", interruptOnCancel=False)
        try:
            self.sc.parallelize([1], 1).count()
            ids = self.sc.statusTracker().getJobIdsForGroup("bench-marker")
            return max(ids) if ids else -1
        finally:
            self.sc.setLocalProperty("spark.jobGroup.id", None)
            self.sc.setLocalProperty("spark.job.description", None)

    @contextmanager
    def count(self, into: dict, key: str = "spark_jobs"):
        start = self.marker()
        try:
            yield
        finally:
            end = self.marker()
            into[key] = max(end - start - 1, 0) if start >= 0 and end >= 0 else None

    def job_floor_seconds(self, repeats: int = 15) -> float:
        """Median wall time of a trivial one-task JVM-only Spark job (one row into the `noop` sink):
        the latency every job pays here however little it does."""
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            spark.range(0, 1, 1, 1).write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t)
        times.sort()
        return times[len(times) // 2]


@contextmanager
def timed(into: dict, key: str):
    """Store the wall seconds of the block in `into[key]` (also when it raises)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        into[key] = round(time.perf_counter() - t, 4)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
