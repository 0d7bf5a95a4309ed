"""Write this install's class-data-sharing archive for Spark's JVM (see engine/spark/class_archive.py).

A local Spark JVM runs Laminar's own work (the serve warm-up's passes of the demo graph and its
checks, on a scratch lake) and, when it exits, writes the classes it loaded to the archive. A second
JVM then starts with `-Xshare:on`, which fails unless the archive maps, so only an archive that
works is put in place. `make demo`, `make ui` and `make test` run this first: it returns at once when
this pyspark's and this Java build's archive exists, and writes it otherwise (about a minute on 2
cores: after install, and after a JDK or pyspark update).

Usage: python -m laminar_assets.deploy.class_archive_writer [--force]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from laminar_assets.engine.spark import archive_path, dump_options, stale_archives
from laminar_assets.errors import EnvironmentProblem

PID_LINE = "laminar-jvm-pid "
MODULE = "laminar_assets.deploy.class_archive_writer"


def create(path: str | None = None, *, timeout: float = 900.0) -> str:
    """Write the archive to `path` (default: this install's) and check a new JVM maps it; returns the path."""
    path = path or archive_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create the folder of the class archive {path}: {exc.strerror or exc}",
                                 path=path) from None
    partial = f"{path}.{os.getpid()}.partial"
    try:
        out = _python(["--dump", partial], timeout, "running Laminar's work in a JVM that writes the archive")
        pid = next((int(line[len(PID_LINE):]) for line in out.splitlines() if line.startswith(PID_LINE)), None)
        if pid is None:
            raise EnvironmentProblem(f"the archive run did not report its JVM; its output ended with: {out[-500:]}")
        _wait_gone(pid, timeout=120.0)  # the JVM writes the archive as it exits, after the Python side
        if not os.path.isfile(partial):
            raise EnvironmentProblem(f"the JVM exited without writing a class archive to {partial}", path=partial)
        _python(["--check", partial], timeout, "starting a JVM that must map the new archive (-Xshare:on)")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def _python(args: list[str], timeout: float, doing: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("LAMINAR_SPARK_REMOTE", "LAMINAR_SPARK_MASTER")}
    # A group of its own: on a timeout the JVM it started goes too (it shares the output pipes, so
    # communicate() waits for it as well).
    proc = subprocess.Popen([sys.executable, "-m", MODULE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise EnvironmentProblem(f"{doing} took longer than {timeout:.0f} s; stopped it") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise EnvironmentProblem(f"{doing} failed (exit {done.returncode}): {' | '.join(tail)}")
    return done.stdout


def _wait_gone(pid: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise EnvironmentProblem(f"the JVM (pid {pid}) was still writing the class archive after {timeout:.0f} s")


def _dump(partial: str) -> None:
    """In a process of its own: Laminar's work on a local JVM that writes `partial` when it exits
    (after this process: the JVM ends when its stdin, this process, closes)."""
    from laminar_assets.deploy.warm_up import exercise
    from laminar_assets.engine import SparkOptions, build_session

    spark = build_session(SparkOptions(master="local[*]", app_name="laminar-class-archive", class_sharing=False,
                                       java_options=dump_options(partial)))
    print(f"{PID_LINE}{spark._jvm.java.lang.ProcessHandle.current().pid()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="laminar-class-archive-") as root:
        exercise(spark, root)
    spark.stop()


def _check(partial: str) -> None:
    """In a process of its own: a JVM that must map the archive (`-Xshare:on` refuses to start otherwise)."""
    from laminar_assets.engine import SparkOptions, build_session

    spark = build_session(SparkOptions(master="local[1]", app_name="laminar-class-archive-check",
                                       class_sharing=False,
                                       java_options=f"-Xshare:on -XX:SharedArchiveFile={partial}"))
    spark.range(3).selectExpr("sum(id)").collect()
    spark.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"] and len(argv) == 2:
        _dump(argv[1])
        return 0
    if argv[:1] == ["--check"] and len(argv) == 2:
        _check(argv[1])
        return 0
    if argv not in ([], ["--force"]):
        print("usage: python -m laminar_assets.deploy.class_archive_writer [--force]", file=sys.stderr)
        return 2
    path = archive_path()
    if os.path.isfile(path) and not argv:
        print(f"Spark class archive: {path} (exists)")
        return 0
    t = time.perf_counter()
    try:
        create(path)
    except EnvironmentProblem as exc:
        print(f"Spark class archive not written ({exc.message}); Spark starts without it, only slower",
              file=sys.stderr)
        return 1
    print(f"Spark class archive: {path} ({os.path.getsize(path) / 2**20:.0f} MiB, {time.perf_counter() - t:.0f} s)")
    for stale in stale_archives(path):  # another pyspark's or JDK's: the JVM would ignore it
        os.remove(stale)
        print(f"removed the class archive of another pyspark or Java build: {stale}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
