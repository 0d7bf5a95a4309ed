"""`laminar serve` stops everything it started on the signals a user sends it, however it was started.

Its servers run in sessions of their own, so a signal it ignores or dies of leaves them running as
orphans. A shell starts a background job (`make ui &` in a script, a CI step) with SIGINT ignored:
`kill -INT` then did nothing, and whoever killed it next orphaned `dagster dev` and the Spark
Connect server. These tests start the real command (without a Connect server, to stay quick: the
server is stopped by the same code path) and check what is left afterwards.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.deploy.processes import kill_tagged, listening
from tests.deploy.serve_process import start_serve, stopped_cleanly

pytestmark = pytest.mark.deployment


def test_sigint_stops_it_even_when_started_with_sigint_ignored_and_sighup_respects_nohup(tmp_path):
    proc, ui, home = start_serve(tmp_path, ignored=(signal.SIGINT, signal.SIGHUP))
    try:
        os.kill(proc.pid, signal.SIGHUP)  # ignored on purpose (nohup): keeps serving
        time.sleep(3)
        assert proc.poll() is None and listening(ui), "serve stopped on a SIGHUP it was started to ignore"
        os.kill(proc.pid, signal.SIGINT)
        stopped_cleanly(proc, ui, home, tmp_path / "serve.log")
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["sighup", "sigterm"])
def test_a_closed_terminal_or_sigterm_stops_everything(tmp_path, sig):
    proc, ui, home = start_serve(tmp_path, ignored=(signal.SIGINT,))
    try:
        os.kill(proc.pid, sig)
        stopped_cleanly(proc, ui, home, tmp_path / "serve.log")
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))
