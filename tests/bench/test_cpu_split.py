"""The benchmark's CPU split: per-thread CPU times from /proc, sorted into kinds, and the sentence
the report prints (no Spark: the Python side is measured on a busy loop, the JVM side on a fake)."""

from __future__ import annotations

import time

import pytest

from bench import cpu_split, render, report
from bench.cpu_split import CpuSplit

from .test_bench_report import _fake, _size

pytestmark = pytest.mark.skipif(not __import__("os").path.exists("/proc/self/task"), reason="Linux /proc only")


def test_thread_names_sort_into_kinds():
    assert cpu_split._kind("C2 CompilerThre") == "jit_compiler"
    assert cpu_split._kind("C1 CompilerThre") == "jit_compiler"
    assert cpu_split._kind("Executor task l") == "spark_tasks"
    assert cpu_split._kind("GC Thread#0") == "gc"
    assert cpu_split._kind("G1 Conc#0") == "gc"
    assert cpu_split._kind("Thread-7") == "jvm_other"


def test_python_cpu_of_a_busy_phase_is_counted_and_an_idle_one_is_not(monkeypatch):
    monkeypatch.setattr(cpu_split, "spark_jvm", lambda: None)  # no JVM in this process tree
    with CpuSplit() as busy:  # 0.6 s of this thread's own CPU, however busy the machine is
        end = time.thread_time() + 0.6
        n = 0
        while time.thread_time() < end:
            n += 1
    with CpuSplit() as idle:
        time.sleep(0.4)
    assert busy.result["cpu_s"]["python"] >= 0.3  # ~0.6 s of one core, at 100 ticks a second
    assert idle.result["cpu_s"]["python"] <= 0.1
    assert busy.result["cpu_s"]["jit_compiler"] == 0 and busy.result["cpu_s"]["jvm_other"] == 0
    assert 0 < busy.result["capacity_used"] <= 1.0


def test_threads_that_ended_in_the_phase_count_as_other_jvm_threads(monkeypatch):
    """The process total minus the named live threads: a Py4J thread that served one call and ended."""
    snapshots = iter([
        ({"1 C2 CompilerThre": 100, "2 Executor task l": 50}, 1000, 10),
        ({"1 C2 CompilerThre": 160, "2 Executor task l": 90, "3 Thread-9": 5}, 1200, 40),
    ])
    split = CpuSplit()
    monkeypatch.setattr(split, "_snapshot", lambda: next(snapshots))
    with split:
        pass
    hz = __import__("os").sysconf("SC_CLK_TCK")
    cpu = split.result["cpu_s"]
    assert cpu["jit_compiler"] == round(60 / hz, 3) and cpu["spark_tasks"] == round(40 / hz, 3)
    assert cpu["jvm_other"] == round((200 - 100) / hz, 3)  # 5 live + 95 from threads gone by the end
    assert cpu["python"] == round(30 / hz, 3)


def test_the_report_says_who_used_the_cpu():
    cpu = {"wall_s": 0.8, "cores": 2, "cpu_total_s": 1.4, "capacity_used": 0.875,
           "cpu_s": {"jit_compiler": 0.48, "python": 0.41, "jvm_other": 0.3, "spark_tasks": 0.17, "gc": 0.04}}
    size = _size(10_000_000, 12.0, 150.0)
    size["incremental_batched"]["cpu"] = cpu
    size["full_recompute"] = {"cpu": {**cpu, "wall_s": 6.0, "cpu_total_s": 11.0, "capacity_used": 0.92}}
    r = report.summarize(_fake(by_size=[size]))
    text = cpu_split.describe(r["breakdown_incremental_batched"]["cpu"])
    assert text.startswith("CPU while timed: 1.40 s in 0.80 s of wall time on 2 cores (88% of the machine): "
                           "jit compiler 0.48 s, python 0.41 s")
    md = render.markdown(r)
    assert text in md and "The full recompute, for comparison: 11.00 s in 6.00 s of wall time" in md
