"""`laminar serve` stops a process group, not only its leader.

CI once saw `dagster dev` exit on SIGINT while a code server it had just started (still loading, so it
had not acted on the signal yet) went on running after `laminar serve` returned. Here a leader that
exits on SIGINT leaves a child that ignores SIGINT: the stop must end the child too, and return only
when the group is empty.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from laminar_assets.deploy.serve import _group_alive, _stop_group

pytestmark = pytest.mark.process

LEADER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)  # SIGINT ends the leader at once (KeyboardInterrupt); the child ignores it
"""


def test_a_child_that_outlives_its_leader_is_stopped_with_the_group():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        assert _group_alive(leader.pid)
        _stop_group(leader, timeout=2)
        assert leader.poll() is not None
        assert not _group_alive(leader.pid), "a process of the group is still running after the stop"
        assert not _running(child), "the child that ignored SIGINT outlived the stop"
    finally:
        if leader.poll() is None:
            leader.kill()
        try:
            os.killpg(leader.pid, 9)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def test_a_group_that_stops_on_sigint_returns_at_once():
    leader = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    leader.stdout.readline()
    _stop_group(leader, timeout=30)
    assert leader.returncode is not None and not _group_alive(leader.pid)
