"""`python -m laminar_assets.deploy.local_store {s3,gcs,azure} -- COMMAND` (what `make demo-s3`, `make demo-gcs`
and `make demo-azure` run): the command finds its lake through LAMINAR_ROOT and the store's usual variables
alone, writes a Delta table and Laminar's own objects there, its exit code is the runner's, and the emulator
is gone when it ends. The demo itself on each store is the same path as the tests' lakes on each store."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.process

# what a user's command does with only the environment the runner gives it: a Delta table and an
# object of Laminar's own under LAMINAR_ROOT, read back; then the exit code the runner must pass on
CHILD = """
import os, sys
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from laminar_assets import storage
root = os.environ["LAMINAR_ROOT"]
uri = storage.join(root, "trades")
write_deltalake(uri, pa.table({"x": [1, 2, 3]}), storage_options=storage.delta_options(uri))
assert DeltaTable(uri, storage_options=storage.delta_options(uri)).to_pyarrow_table()["x"].to_pylist() == [1, 2, 3]
mark = storage.join(root, "_laminar", "hello.json")
assert storage.create(mark, b"{}") and storage.read(mark) == b"{}"
print("root", root, os.environ["LAMINAR_LOCAL_STORE"], flush=True)
sys.exit(3)
"""


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laminar_assets.deploy.local_store", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _closed(endpoint: str) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", urlsplit(endpoint).port)) != 0


@pytest.mark.parametrize("store, root", [("s3", "s3://demo-bucket/lake"), ("gcs", "gs://demo-bucket/lake"),
                                         ("azure", "abfss://demo-bucket@devstoreaccount1.dfs.core.windows.net/lake")])
def test_a_command_reaches_its_lake_in_the_emulator_through_the_environment_alone(store, root):
    done = _run(store, "--bucket", "demo-bucket", "--", sys.executable, "-c", CHILD)
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own exit code
    started = re.search(rf"^local {store} store at (http://127\.0\.0\.1:\d+); lake at (\S+)$", done.stdout, re.M)
    assert started and started.group(2) == root, done.stdout
    assert f"root {root} {store}" in done.stdout
    assert _closed(started.group(1)), f"the {store} emulator still listens at {started.group(1)}"


def test_what_the_runner_refuses_it_says_before_starting_anything():
    done = _run("gcs", "--latency-ms", "20", "--", "true")
    assert done.returncode == 2 and "--latency-ms is the S3 server's only" in done.stderr, done.stderr
    done = _run("s3")
    assert done.returncode == 2 and "give the command to run after --" in done.stderr, done.stderr
    done = _run("hdfs", "--", "true")
    assert done.returncode == 2 and "invalid choice: 'hdfs'" in done.stderr, done.stderr
    done = _run("s3", "--latency-ms", "-5", "--", "true")
    assert done.returncode == 2 and "latency must be a number of milliseconds >= 0" in done.stderr, done.stderr
    done = _run("s3", "--seconds", "-1", "--", "true")
    assert done.returncode == 2 and "--seconds must be 0 (no limit) or more" in done.stderr, done.stderr
    for store, bucket in (("s3", "UPPER_case"), ("gcs", "a"), ("azure", "two--hyphens"), ("gcs", "")):
        done = _run(store, "--bucket", bucket, "--", "true")
        assert done.returncode == 2 and f"--bucket {bucket!r} is not a {store} bucket name" in done.stderr, done.stderr


def test_a_command_that_cannot_run_is_one_line_with_a_shells_exit_code(tmp_path):
    done = _run("s3", "--", "no-such-command-here")
    assert done.returncode == 127 and done.stderr.strip().splitlines()[-1].startswith(
        "error: cannot run 'no-such-command-here'"), done.stderr
    assert "Traceback" not in done.stderr
    done = _run("s3", "--", str(tmp_path))
    assert done.returncode == 126 and "Traceback" not in done.stderr, done.stderr


def test_a_time_limit_or_a_signal_stops_the_command_and_the_emulator_with_a_shells_exit_code():
    import signal
    import time

    done = _run("s3", "--seconds", "2", "--", sys.executable, "-c", "import time; time.sleep(60)")
    assert done.returncode == 124 and "stopping after 2 s" in done.stderr, done.stderr
    started = re.search(r"store at (http://\S+);", done.stdout)
    assert started and _closed(started.group(1))
    # SIGTERM (a service manager, `kill`): the command is told to stop and the emulator goes with it
    proc = subprocess.Popen([sys.executable, "-m", "laminar_assets.deploy.local_store", "s3", "--", sys.executable,
                             "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 130
    proc.stdout.close()
    assert _closed(re.search(r"store at (http://\S+);", line).group(1))
    # kill -9 of the runner, which can clean nothing up: the kernel stops the emulator (its parent-death signal)
    proc = subprocess.Popen([sys.executable, "-m", "laminar_assets.deploy.local_store", "s3", "--", sys.executable,
                             "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    endpoint = re.search(r"store at (http://\S+);", proc.stdout.readline()).group(1)
    assert not _closed(endpoint)
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    deadline = time.monotonic() + 20
    while not _closed(endpoint) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _closed(endpoint), f"the emulator at {endpoint} outlived its runner's kill -9"


def test_the_demo_does_not_send_you_to_make_ui_for_a_lake_the_emulator_takes_with_it():
    from laminar_assets.cli.run_commands import next_steps

    assert "`make ui`" in next_steps(".laminar/lake")
    gone = next_steps("gs://laminar-demo/lake", "gcs")
    assert "`make ui`" not in gone and "in the local gcs emulator's memory" in gone and "make ui-s3" in gone
