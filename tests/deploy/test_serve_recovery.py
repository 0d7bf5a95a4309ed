"""`laminar serve` brings back what dies under it, with no one to restart anything: a code server (which `dagster
dev` leaves dead) and a Spark Connect server (whose death took the whole deployment down), and the run session
that lost its server is retried on the new one. The real command, the real processes killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.deploy.processes import free_port, kill_tagged, listening, tagged, wait_for
from tests.deploy.serve_process import REPO, start_serve, stopped_cleanly

pytestmark = pytest.mark.deployment


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
    proc, ui, home = start_serve(tmp_path, ignored=())
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
        stopped_cleanly(proc, ui, home, log)
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


def test_a_spark_connect_server_that_dies_or_hangs_is_started_again_on_its_port(tmp_path):
    """A Connect server killed under `laminar serve` (out of memory, `kill -9`) took the whole deployment down;
    now a new one listens on the same port, so the runs that lost it succeed on their retries. A server that hangs
    (`kill -STOP`) held every run's step without a bound; now serve finds it silent, kills it and starts another."""
    spark_port = free_port()
    proc, ui, home = start_serve(tmp_path, ignored=(), spark=["--spark-port", str(spark_port), "--driver-memory", "1g",
                                                              "--spark-probe-seconds", "3"])
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

        [second] = servers()
        os.kill(second, signal.SIGSTOP)  # hung: its port still accepts, nothing answers
        wait_for(lambda: log.read_text().count("is up again") == 2, 180, "serve to replace the hung server",
                 alive=lambda: proc.poll() is None)
        said = log.read_text()
        assert f"the Spark Connect server on sc://127.0.0.1:{spark_port} has not answered for at least " in said, said[-1500:]
        assert "(3 questions in a row; the last: no answer within 3 s); killing it" in said, said[-1500:]
        assert "the Spark Connect server was killed after " in said and " without an answer (see " in said, said[-1500:]
        assert second not in servers() and servers() and listening(spark_port)
        os.kill(proc.pid, signal.SIGINT)
        stopped_cleanly(proc, ui, home, log)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        if proc.poll() is None:
            proc.kill()
        kill_tagged("DAGSTER_HOME", str(home))


def _dead_server(options, code: int = 9):
    """A ConnectServer whose process has exited with `code` (a real process; no JVM needed for the count)."""
    from laminar_assets.deploy.connect_server import ConnectServer

    process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    process.wait()
    return ConnectServer(options, process)


def test_a_server_that_dies_while_restarting_counts_as_one_more_exit_up_to_the_limit(tmp_path, monkeypatch):
    """A new server killed before it listened made serve exit at once, restarts left unused (a careless-user
    review killed it 2 s into its start)."""
    from laminar_assets.deploy import serve as serve_module
    from laminar_assets.deploy.connect_server import ConnectServerOptions
    from laminar_assets.deploy.serve import Deployment, ServeOptions, _restart_spark
    from laminar_assets.errors import EnvironmentProblem

    spark_options = ConnectServerOptions(port=free_port(), log_path=str(tmp_path / "spark-connect.log"))
    options = ServeOptions(root=str(tmp_path / "lake"), dagster_home=str(tmp_path), warm_up=False, spark=spark_options)
    outcomes = ["dies", "dies", "starts"]

    def start(given):
        assert given is spark_options
        if outcomes.pop(0) == "dies":
            raise EnvironmentProblem("the Spark Connect server exited with code -9 before listening")
        return _dead_server(given, 0)  # stands for a server that started (its process is not asked again here)

    monkeypatch.setattr(serve_module, "start_connect_server", start)
    deployment = Deployment(dagster=None, spark=_dead_server(spark_options), remote=spark_options.url,  # type: ignore[arg-type]
                            ui_url="http://127.0.0.1:1")
    said: list[str] = []
    exits: list[float] = []
    _restart_spark(deployment, options, exits, said.append)
    assert len(exits) == 3 and not outcomes
    assert [line.split(" (restart ")[1][:1] for line in said if "(restart " in line] == ["1", "2", "3"]
    assert sum("did not start" in line for line in said) == 2 and said[-1].startswith("the Spark Connect server is up")
    # one more exit within the window is one past the limit: serve stops, saying why, in one error
    deployment.spark = _dead_server(spark_options)
    with pytest.raises(EnvironmentProblem, match=r"4 exits within 600 s, more than the 3 restarts `laminar serve` "
                                                 r"makes, so a restart does not cure it; stopped everything"):
        _restart_spark(deployment, options, exits, said.append)
