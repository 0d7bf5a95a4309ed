"""`laminar` commands run in the calling process, through the entry point's own error handling.

A `laminar` process imports Dagster and PySpark before its command starts, seconds of CPU each time; tests of
what a command says and which code it ends with run it here instead, with `_run_command` (the body of
`laminar_assets.cli.main`: a LaminarError as one red line and exit 1, a usage error as one line and exit 2).
What only a process of its own shows (its exit code after `run_then_exit`, a signal, a kill) is still tested
with real `laminar` processes.

`python -m tests.cli_in_process '[["sql", "SELECT 1"], ...]'` runs several commands in one fresh process (one
import, one Spark Connect session) and prints one JSON line: each command's code, stdout and stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from unittest import mock


def run_in_process(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`laminar ARGS` here, with `env` added to the environment for its duration: the code it would exit with,
    and what it wrote to stdout and stderr."""
    from laminar_assets.cli.app import _run_command
    from laminar_assets.process_exit import exit_code_of

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "argv", ["laminar", *args]), mock.patch.dict(os.environ, env or {}), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _run_command() or 0
        except SystemExit as exc:
            code = exit_code_of(exc)
    return subprocess.CompletedProcess(["laminar", *args], code, out.getvalue(), err.getvalue())


def main(commands: list[list[str]]) -> int:
    done = [run_in_process(args) for args in commands]
    print(json.dumps([{"code": d.returncode, "stdout": d.stdout, "stderr": d.stderr} for d in done]), flush=True)
    return 0


if __name__ == "__main__":
    from laminar_assets.process_exit import run_then_exit

    run_then_exit(lambda: main(json.loads(sys.argv[1])))
