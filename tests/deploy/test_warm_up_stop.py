"""A stopped warm-up cancels its work and waits for it to end before the caller removes its folder:
on Python 3.11 a KeyboardInterrupt inside Thread.join() marks the running thread as ended, and a
warm-up that trusted it removed its folder while the work went on writing (1 stop in 15 under load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import _thread, threading, time
from laminar_assets.deploy.warm_up import run_stoppable

state = {"cancels": 0, "writes_after_return": 0, "ended": False}
stop = threading.Event()
returned = threading.Event()
started = threading.Event()

def work():
    started.set()
    # like Laminar's passes: keeps going until a cancel reaches it, then fails the way a cancelled query does
    while not stop.is_set():
        time.sleep(0.01)
    time.sleep(0.3)  # the error handling still writes for a while
    state["writes_after_return"] += returned.is_set()
    state["ended"] = True
    raise RuntimeError("OPERATION_CANCELED")

def cancel():
    state["cancels"] += 1
    stop.set()

def interrupt():  # a stop while the work runs, however slowly this interpreter got there
    started.wait(60)
    time.sleep(0.2)
    _thread.interrupt_main()

threading.Thread(target=interrupt, daemon=True).start()
try:
    run_stoppable(work, cancel=cancel, grace=10)
except KeyboardInterrupt:
    returned.set()
    print(state["cancels"] >= 1, state["ended"], state["writes_after_return"])
else:
    print("not stopped")

# the work's own error reaches the caller; its result too
try:
    run_stoppable(lambda: 1 / 0, cancel=cancel)
except ZeroDivisionError:
    print("error raised")
print(run_stoppable(lambda: {"batch 0": 1.0}, cancel=cancel))
"""


def test_a_stop_cancels_the_work_and_returns_only_after_it_ended():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["True True 0", "error raised", "{'batch 0': 1.0}"], proc.stdout
