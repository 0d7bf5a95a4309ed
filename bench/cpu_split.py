"""Who used the CPU during a timed phase: the Spark JVM by thread kind, and the Python driver.

A phase on a 2-core machine can be CPU-bound without any Spark task being busy: the JVM's
just-in-time compiler, Catalyst (parsing, analysis, optimization, planning of each query, on the
driver thread that serves the Python call) and the Python driver share the cores with the tasks.
`CpuSplit` reads per-thread CPU times from Linux `/proc/<pid>/task/*/stat` at the start and the end
of a phase and sorts the JVM's into kinds by thread name. Threads that ended within the phase (Py4J
serves each Python thread on a thread of its own) are in the process total but not in any live
thread: they count as `jvm_other`, with the driver's other threads.
"""

from __future__ import annotations

import os
import time

from .measure import command_of, descendants, process_group

KINDS = {
    "jit_compiler": "the JVM's just-in-time compiler threads (C1/C2)",
    "spark_tasks": "Spark executor task threads (the scans, aggregations and writes)",
    "gc": "garbage collection and the VM thread (safepoints)",
    "jvm_other": "other JVM threads: the driver's Catalyst work per query (parse, analysis, optimization, "
                 "planning, on the thread serving the Python call), scheduling, Py4J",
    "python": "the Python driver (Laminar, deltalake and pyarrow in the same process)",
}


def _kind(thread_name: str) -> str:
    if "CompilerThre" in thread_name:
        return "jit_compiler"
    if thread_name.startswith("Executor task"):
        return "spark_tasks"
    if thread_name.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "gc"
    return "jvm_other"


def _ticks(stat_path: str) -> tuple[str, int] | None:
    try:
        with open(stat_path) as fh:
            stat = fh.read()
    except OSError:
        return None
    name = stat[stat.find("(") + 1:stat.rfind(")")]
    fields = stat[stat.rfind(")") + 2:].split()
    return name, int(fields[11]) + int(fields[12])  # utime + stime


def spark_jvm() -> int | None:
    """The local-mode Spark JVM: this process's `java` descendant in its process group."""
    group = os.getpgid(0)
    jvms = [pid for pid in descendants(os.getpid()) if command_of(pid) == "java" and process_group(pid) == group]
    return jvms[0] if jvms else None


class CpuSplit:
    """Context manager: `result` holds CPU seconds per kind (`KINDS`), the wall time and the
    share of the machine's capacity the process tree used, once the block has run."""

    def __init__(self) -> None:
        self.result: dict = {}
        self.jvm = spark_jvm()

    def _snapshot(self) -> tuple[dict[str, int], int, int]:
        threads: dict[str, int] = {}
        total = 0
        if self.jvm is not None:
            total = (_ticks(f"/proc/{self.jvm}/stat") or ("", 0))[1]
            try:
                tids = os.listdir(f"/proc/{self.jvm}/task")
            except OSError:
                tids = []
            for tid in tids:
                got = _ticks(f"/proc/{self.jvm}/task/{tid}/stat")
                if got:
                    threads[f"{tid} {got[0]}"] = got[1]
        return threads, total, (_ticks(f"/proc/{os.getpid()}/stat") or ("", 0))[1]

    def __enter__(self) -> CpuSplit:
        self.t0 = time.perf_counter()
        self.start = self._snapshot()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t0
        threads, total, python = self._snapshot()
        hz = os.sysconf("SC_CLK_TCK")
        kinds = dict.fromkeys(KINDS, 0)
        for key, ticks in threads.items():
            kinds[_kind(key.split(" ", 1)[1])] += ticks - self.start[0].get(key, 0)
        # the process total also holds threads that ended in the phase: the driver's, not named here
        live = sum(v for k, v in kinds.items() if k != "jvm_other")
        kinds["jvm_other"] = max(total - self.start[1] - live, 0)
        kinds["python"] = python - self.start[2]
        cpu = {k: round(v / hz, 3) for k, v in kinds.items()}
        used = sum(cpu.values())
        self.result = {"wall_s": round(wall, 4), "cores": os.cpu_count(), "cpu_s": cpu, "cpu_total_s": round(used, 3),
                       "capacity_used": round(used / (wall * (os.cpu_count() or 1)), 3) if wall else None}


def describe(cpu: dict | None) -> str:
    """One sentence for the report: CPU by kind over the phase's wall time."""
    if not cpu or not cpu.get("cpu_s"):
        return ""
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in
                      sorted(cpu["cpu_s"].items(), key=lambda kv: -kv[1]))
    return (f"CPU while timed: {cpu['cpu_total_s']:.2f} s in {cpu['wall_s']:.2f} s of wall time on "
            f"{cpu.get('cores')} cores ({cpu['capacity_used']:.0%} of the machine): {parts}.")
