"""What a benchmark run ran on and under: the Spark session, the code measured (git HEAD, uncommitted
engine files, a hash), the machine, a wait for a quiet machine, and the note on reduced sizes."""

from __future__ import annotations

import os
import platform
import sys
import time

from .config import Profile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_session(profile: Profile, result: dict):
    """The bench's one warm Spark session (local[2], the engine's `build_session`); notes it in `result`."""
    from laminar_assets.engine import SparkOptions, build_session

    from .measure import timed

    with timed(result, "spark_start_s"):
        spark = build_session(SparkOptions(master="local[2]", app_name="laminar-bench",
                                           driver_memory=profile.driver_memory,
                                           shuffle_partitions=profile.shuffle_partitions))
    result["spark"] = {"version": spark.version, "master": spark.sparkContext.master, "jit": SparkOptions().jit,
                       "driver_memory": profile.driver_memory, "shuffle_partitions": profile.shuffle_partitions}
    return spark


def code_fingerprint() -> dict:
    """Which code was measured: git HEAD, uncommitted changes under laminar_assets/, and a hash of
    the engine and Dagster layer as loaded when the run started."""
    import glob
    import hashlib
    import subprocess

    def git(*cmd) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(REPO, "laminar_assets", "**", "*.py"), recursive=True)):
        with open(path, "rb") as fh:
            digest.update(path.encode() + b"\0" + fh.read())
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "laminar_assets").splitlines()]
    return {"git_head": git("rev-parse", "--short", "HEAD").strip(), "laminar_assets_sha256": digest.hexdigest()[:16],
            "uncommitted_laminar_assets_files": dirty}


def wait_quiet(limit: float, threshold: float) -> dict:
    """Wait (up to `limit` seconds) until the 1-minute load average is below `threshold`."""
    t = time.perf_counter()
    while os.getloadavg()[0] >= threshold and time.perf_counter() - t < limit:
        print(f"bench: waiting for a quieter machine (load {os.getloadavg()[0]:.2f} >= {threshold})", flush=True)
        time.sleep(15)
    quiet = os.getloadavg()[0] < threshold
    return {"waited_s": round(time.perf_counter() - t, 1), "threshold": threshold, "reached": quiet}


def machine() -> dict:
    try:
        with open("/proc/meminfo") as fh:
            mem_kb = int(fh.readline().split()[1])
    except OSError:
        mem_kb = 0
    return {"cpus": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1), "python": sys.version.split()[0],
            "platform": platform.platform()}


def sizes_note(profile: Profile) -> str:
    sizes = sorted(profile.sizes)
    if profile.name == "full" and sizes == [1_000_000, 3_000_000, 10_000_000]:
        return "full sizes as specified: B = 1M, 3M, 10M; Δ fixed at 1% of 10M"
    return (f"reduced sizes (profile '{profile.name}'): B = {', '.join(f'{s:,}' for s in sizes)}; targets that "
            "name 1M/10M are computed between the smallest and largest size here and are not comparable")
