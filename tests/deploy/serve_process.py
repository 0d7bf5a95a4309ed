"""`laminar serve` as a test starts it: the real command in a process of its own, on free ports, with a
DAGSTER_HOME of the test's own by which every process it starts can be found (tests/deploy/processes.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.deploy.processes import free_port, kill_tagged, listening, wait_for

REPO = Path(__file__).resolve().parents[2]


def start_serve(tmp_path: Path, ignored: tuple[int, ...], spark: list[str] | None = None
               ) -> tuple[subprocess.Popen, int, Path]:
    """`laminar serve` with `ignored` signals ignored from the start, as a shell's background job has them;
    without a Spark Connect server unless `spark` gives its options."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "LAMINAR_ROOT": str(tmp_path / "lake")}
    env.pop("LAMINAR_SPARK_REMOTE", None)
    ui = free_port()

    def ignore() -> None:
        # exactly `ignored` ignored, whatever the test runner inherited: a runner started under nohup
        # passes SIGHUP on ignored, and serve (rightly) keeps an ignored SIGHUP ignored
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "laminar_assets.cli", "--root", str(tmp_path / "lake"), "serve",
                             "--ui-port", str(ui), *(spark or ["--local-spark"]), "--no-warm-up"], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=ignore)
    log.close()
    wait_for(lambda: listening(ui), 180, "the Dagster UI", alive=lambda: proc.poll() is None)
    return proc, ui, home


def stopped_cleanly(proc: subprocess.Popen, ui: int, home: Path, log: Path) -> None:
    """After a stop signal: serve exited 0 within 90 s and left no process of its DAGSTER_HOME and no UI behind."""
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    leftovers = kill_tagged("DAGSTER_HOME", str(home), grace=15)
    assert code == 0, f"serve did not exit 0 within 90 s of the signal (code {code}):\n{log.read_text()[-2000:]}"
    assert not leftovers, f"serve left {len(leftovers)} process(es) running: {leftovers}"
    assert not listening(ui)
