"""Exit codes tell the truth: a `laminar` command ends with the code of what it did, even when the interpreter's
teardown after it would abort (SIGABRT, 134: "terminate called without an active exception", seen in a few runs
in a hundred of anything that reads Delta tables with deltalake 1.6.6, docs/known-limits.md).

`tests/cli/abort_at_exit.py` makes that abort happen at every exit instead of a few in a hundred, so each test
here fails on an entry point that lets the teardown run, every time, not by chance."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from laminar_assets.cli.app import INTERRUPTED

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
ABORT = "terminate called without an active exception"
ARM = "from tests.cli.abort_at_exit import arm; arm(); "


def python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -c code ARGS` in the repository (its `tests` and `laminar_assets` importable)."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="CPython 3.14 parks such a thread instead of ending it: no abort")
def test_the_trap_aborts_a_process_that_tears_down():
    """The premise of the tests below: an armed process that exits through the interpreter's teardown aborts
    after its work, as deltalake's reads sometimes make it, with the same message."""
    proc = python(ARM + "print('work done')")
    assert proc.stdout == "work done\n"
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr)
    assert ABORT in proc.stderr


@pytest.mark.parametrize("args, code", [
    (["dag", "--json"], 0),        # success: its whole output, and 0
    (["explain", "nope"], 1),      # a LaminarError: one red line, and 1
    (["status", "--bogus"], 2),    # a usage error: 2
], ids=["success", "error", "usage"])
def test_laminar_exits_with_its_commands_code_despite_an_abort_at_exit(tmp_path, args, code):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh")}
    proc = python(ARM + "from laminar_assets.cli import main; main()", "--root", str(tmp_path), *args, env=env)
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert ABORT not in proc.stderr
    if code == 0:
        nodes = {row["node"] for row in json.loads(proc.stdout)}  # complete: flushed before the process ended
        assert {"raw_trades", "normalized_trades", "vwap_1m"} <= nodes
    else:
        assert "error:" in proc.stderr


@pytest.mark.parametrize("raises, code", [("typer.Exit(3)", 3), ("KeyboardInterrupt()", 130)], ids=["exit-3", "ctrl-c"])
def test_a_command_that_exits_with_a_code_or_is_interrupted_keeps_that_code(raises, code):
    """Typer returns (not raises) the code of a `typer.Exit` or an interrupt inside a command when `laminar` runs
    it: that code is the exit status, not 0."""
    program = ("import typer\nfrom laminar_assets.cli import app, main\n"
               f"@app.command('stop')\ndef stop():\n    raise {raises}\nmain()\n")
    proc = python(program, "stop")
    assert proc.returncode == code, proc.stderr
    if code == 130:  # one line: that it was interrupted and the state it left, no traceback
        assert proc.stderr.splitlines() == ["interrupted: " + INTERRUPTED], proc.stderr
    else:
        assert "interrupted" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("body, code, stderr", [
    ("return None", 0, None),
    ("return 3", 3, None),
    ("sys.exit('cannot go on')", 1, "cannot go on"),
    ("raise ValueError('broken')", 1, "ValueError: broken"),  # the traceback, as for an uncaught exception
], ids=["none", "int", "exit-message", "exception"])
def test_an_entry_point_exits_with_its_outcome_despite_an_abort_at_exit(body, code, stderr):
    """What the warm run worker's entry point (`run_then_exit(main)`) and `laminar`'s rest on."""
    program = ARM + ("import sys\nfrom laminar_assets.process_exit import run_then_exit\n"
                     f"def main():\n    print('work done')\n    {body}\nrun_then_exit(main)\n")
    proc = python(program)
    assert (proc.returncode, proc.stdout) == (code, "work done\n"), proc.stderr
    assert ABORT not in proc.stderr
    if stderr:
        assert stderr in proc.stderr


def test_exit_process_does_pythons_exit_work_first(tmp_path):
    """Ending before the teardown loses nothing a normal exit keeps: a non-daemon thread finishes, atexit handlers
    run, a file left open is flushed, stdout is complete."""
    program = f"""
import atexit, threading
from pathlib import Path
from laminar_assets.process_exit import exit_process
out = Path({str(tmp_path)!r})
go = threading.Event()
def late_writer():
    go.wait()
    (out / "thread.txt").write_text("finished")
threading.Thread(target=late_writer).start()
atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
left_open = open(out / "open.txt", "w")
left_open.write("flushed")
print("all of stdout", end="")
go.set()
exit_process(7)
"""
    proc = python(program)
    assert (proc.returncode, proc.stdout) == (7, "all of stdout"), proc.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "thread.txt": "finished", "atexit.txt": "ran", "open.txt": "flushed"}
