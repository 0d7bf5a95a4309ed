"""`laminar serve` stops everything it started on the signals a user sends it, however it was started.

Its servers run in sessions of their own, so a signal it ignores or dies of leaves them running as
orphans. A shell starts a background job (`make ui &` in a script, a CI step) with SIGINT ignored:
`kill -INT` then did nothing, and whoever killed it next orphaned `dagster dev` and the Spark
Connect server. These tests start the real command (without a Connect server, to stay quick: the
server is stopped by the same code path) and check what is left afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.processes import free_port, kill_tagged, listening, tagged, wait_for

pytestmark = pytest.mark.deployment

REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, ignored: tuple[int, ...], spark: list[str] | None = None
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


def _stopped_cleanly(proc: subprocess.Popen, ui: int, home: Path, log: Path) -> None:
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    leftovers = kill_tagged("DAGSTER_HOME", str(home), grace=15)
    assert code == 0, f"serve did not exit 0 within 90 s of the signal (code {code}):\n{log.read_text()[-2000:]}"
    assert not leftovers, f"serve left {len(leftovers)} process(es) running: {leftovers}"
    assert not listening(ui)


def test_sigint_stops_it_even_when_started_with_sigint_ignored_and_sighup_respects_nohup(tmp_path):
    proc, ui, home = _start(tmp_path, ignored=(signal.SIGINT, signal.SIGHUP))
    try:
        os.kill(proc.pid, signal.SIGHUP)  # ignored on purpose (nohup): keeps serving
        time.sleep(3)
        assert proc.poll() is None and listening(ui), "serve stopped on a SIGHUP it was started to ignore"
        os.kill(proc.pid, signal.SIGINT)
        _stopped_cleanly(proc, ui, home, tmp_path / "serve.log")
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["sighup", "sigterm"])
def test_a_closed_terminal_or_sigterm_stops_everything(tmp_path, sig):
    proc, ui, home = _start(tmp_path, ignored=(signal.SIGINT,))
    try:
        os.kill(proc.pid, sig)
        _stopped_cleanly(proc, ui, home, tmp_path / "serve.log")
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))


def _location(ui: int) -> str:
    """The code location's state in the UI: its __typename (RepositoryLocation when loaded) or its error."""
    query = b'{"query": "{ workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError { ' \
            b'__typename ... on PythonError { message } } } } } }"}'
    request = urllib.request.Request(f"http://127.0.0.1:{ui}/graphql", data=query,
                                     headers={"Content-Type": "application/json"})
    try:
        answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
    except OSError as exc:
        return f"no answer: {exc}"
    [entry] = answer["data"]["workspaceOrError"]["locationEntries"]
    loaded = entry["locationOrLoadError"]
    return loaded["__typename"] if loaded["__typename"] == "RepositoryLocation" else loaded["message"]


def test_a_code_server_killed_under_it_is_restarted_without_a_human(tmp_path):
    """`dagster dev` restarts a dead code-server proxy but not the process under it that runs the user's code;
    left alone, every sensor tick failed until someone pressed Reload in the UI."""
    proc, ui, home = _start(tmp_path, ignored=())
    log = tmp_path / "serve.log"

    def code_servers() -> set[int]:
        return {pid for pid, cmd in tagged("DAGSTER_HOME", str(home)).items() if "dagster api grpc" in cmd}

    try:
        wait_for(lambda: _location(ui) == "RepositoryLocation" and code_servers(), 120, "the code location to load")
        [first] = code_servers()
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "loads again" in log.read_text(), 90, "serve to restart the code server",
                 alive=lambda: proc.poll() is None)
        assert _location(ui) == "RepositoryLocation"
        assert code_servers() - {first}, "no new code server"
        said = log.read_text()
        assert "code location 'laminar': its code server stopped answering; restarting it (reload 1;" in said, said
        os.kill(proc.pid, signal.SIGINT)
        _stopped_cleanly(proc, ui, home, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))


# What a step of a daemon-launched run does with its SparkResource: a query, then (the server killed and started
# again meanwhile) a query that fails, wrapped as the engine wraps it, and the retry's query on `get_session()`.
RUN_SESSION = """
import os
import sys
from laminar_assets.errors import RunFailedError
from laminar_assets.resources import SparkResource
spark = SparkResource(remote=sys.argv[1])
print(spark.get_session().range(3).count(), flush=True)
sys.stdin.readline()
try:
    spark.get_session().range(3).count()
    print("no error", flush=True)
except Exception as exc:
    try:
        raise RunFailedError("run failed") from exc
    except RunFailedError as failed:
        print("retryable" if failed.retryable else f"not-retryable {exc!r}", flush=True)
print(spark.get_session().range(7).count(), flush=True)
os._exit(0)  # as a run's process ends (laminar_assets/process_exit.py): no __del__ of the closed session
"""


def test_a_spark_connect_server_that_dies_is_started_again_on_its_port(tmp_path):
    """A Connect server killed under `laminar serve` (out of memory, `kill -9`) took the whole deployment down;
    now a new one listens on the same port, so the runs that lost it succeed on their retries."""
    spark_port = free_port()
    proc, ui, home = _start(tmp_path, ignored=(), spark=["--spark-port", str(spark_port), "--driver-memory", "1g"])
    log = tmp_path / "serve.log"

    def servers() -> set[int]:  # the deployment's only JVM (runs connect to it; no warm-up)
        return {pid for pid, cmd in tagged("DAGSTER_HOME", str(home)).items() if cmd.split(" ", 1)[0].endswith("/java")}

    client = None
    try:
        wait_for(lambda: "Laminar is up" in log.read_text() and listening(spark_port), 180, "the deployment")
        # a run's session on the server, as a daemon-launched run holds one
        client = subprocess.Popen([sys.executable, "-c", RUN_SESSION, f"sc://127.0.0.1:{spark_port}"], cwd=REPO,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "3"
        [first] = servers()
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "is up again" in log.read_text(), 180, "serve to start Spark again",
                 alive=lambda: proc.poll() is None)
        assert listening(spark_port) and listening(ui)
        assert servers() - {first}, "no new Spark Connect server"
        said = log.read_text()
        assert "the Spark Connect server exited (code -9" in said or "the Spark Connect server exited (code 137" \
            in said, said[-1500:]
        # the run's next query fails as a retryable error, and its retry's session works on the new server
        out, err = client.communicate("go\n", timeout=120)
        assert out.split() == ["retryable", "7"], err[-1500:]
        os.kill(proc.pid, signal.SIGINT)
        _stopped_cleanly(proc, ui, home, log)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))
