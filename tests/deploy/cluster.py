"""A Spark standalone cluster (one master, N workers) from the pyspark wheel, on 127.0.0.1, for tests.

The same `spark-class` commands the README's "Deploying" section gives; every process carries
LAMINAR_TEST_CLUSTER=<folder> in its environment, so `stop` can find and kill all of them (workers fork
executor JVMs) even if one of them ignored SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from laminar_assets.engine.spark.session import JIT_OPTIONS
from tests.deploy.processes import free_port, kill_tagged, listening, wait_for

TAG = "LAMINAR_TEST_CLUSTER"
JIT_QUICK = JIT_OPTIONS["quick"]


@dataclass(frozen=True)
class Cluster:
    url: str          # spark://127.0.0.1:<port>, for LAMINAR_SPARK_MASTER / SparkResource(master=...)
    ui_port: int      # the master's web UI (and its /json/ status)
    folder: Path      # logs and the workers' work dirs
    env: dict         # what a driver on this machine needs: loopback, the same Python as the executors

    def status(self) -> dict:
        """The master's /json/ status; an answer that is not this master's JSON fails naming what came."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            body, kind = response.read(), response.headers.get("Content-Type")
        try:
            status = json.loads(body)
        except ValueError:
            raise AssertionError(f"port {self.ui_port} answered /json/ with {kind!r}, not the Spark master's "
                                 f"JSON: {body[:300]!r}") from None
        if status.get("url") != self.url:
            raise AssertionError(f"port {self.ui_port} is the web UI of {status.get('url')!r}, not {self.url}")
        return status

    def alive_workers(self) -> int:
        return sum(w["state"] == "ALIVE" for w in self.status()["workers"])


# The ports the master really bound: Spark moves to the next port when the one asked for is taken
# (something else may grab a free port between `free_port()` and the JVM binding it), so the log is the
# truth. A CI run once read another server's answer on the asked-for UI port.
_BOUND = {"rpc": re.compile(rb"Successfully started service 'sparkMaster' on port (\d+)"),
          "ui": re.compile(rb"Successfully started service 'MasterUI' on port (\d+)")}


def _bound_ports(log: Path) -> dict[str, int] | None:
    text = log.read_bytes() if log.exists() else b""
    found = {name: pattern.search(text) for name, pattern in _BOUND.items()}
    return {name: int(m.group(1)) for name, m in found.items()} if all(found.values()) else None


def _wait_ready(probe, what: str, procs: list) -> None:
    """`wait_for(probe)` while every process lives; a refused connection, a timeout or an odd answer
    (a loaded machine, a server still starting) counts as "not yet", and the last one is in the
    timeout's message."""
    last = []

    def check() -> bool:
        try:
            return probe()
        except (OSError, AssertionError) as exc:
            last[:] = [exc]
            return False
    try:
        wait_for(check, 120, what, alive=lambda: all(p.poll() is None for p in procs))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {last[0] if last else 'none'}") from None


def _spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


@contextmanager
def standalone_cluster(folder: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", python: str):
    """Start a master and `workers` workers, wait until all registered, yield a `Cluster`, always stop."""
    folder.mkdir(parents=True, exist_ok=True)
    # C1 only in every JVM of the cluster (its daemons here, each application's executors through the
    # conf folder every driver of `Cluster.env` reads): tiny test tables never repay C2's compile time
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions {JIT_QUICK}\n")
    asked, asked_ui = free_port(), free_port()
    env = {**os.environ, TAG: str(folder), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python,
           "SPARK_LOG_DIR": str(folder), "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
           "SPARK_DAEMON_JAVA_OPTS": JIT_QUICK, "SPARK_CONF_DIR": str(conf)}
    env.pop("LAMINAR_SPARK_REMOTE", None)
    procs, logs, bound = [], [], {}

    def launch(name: str, *args: str) -> None:
        log = open(folder / f"{name}.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen([_spark_class(), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    try:
        launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(asked),
               "--webui-port", str(asked_ui))
        log = folder / "master.log"
        try:
            wait_for(lambda: _bound_ports(log) is not None, 120, "the Spark master's ports in its log",
                     alive=lambda: procs[0].poll() is None)
        except AssertionError as exc:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise AssertionError(f"{exc} (its 'Successfully started service' lines are INFO messages: does the "
                                 f"environment's Spark log4j configuration hide them?); {log} ends with: {tail}") from None
        bound = _bound_ports(log)
        url = f"spark://127.0.0.1:{bound['rpc']}"
        cluster = Cluster(url=url, ui_port=bound["ui"], folder=folder,
                          env={"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python, TAG: str(folder),
                               "SPARK_CONF_DIR": str(conf)})
        _wait_ready(lambda: cluster.status() is not None, "the Spark master's status page", procs)
        for i in range(workers):
            launch(f"worker{i + 1}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                   "--cores", str(cores), "--memory", memory, "--webui-port", "0",
                   "--work-dir", str(folder / f"work{i + 1}"), url)
        _wait_ready(lambda: cluster.alive_workers() == workers, f"{workers} Spark workers to register", procs)
        yield cluster
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for log in logs:
            log.close()
        left = kill_tagged(TAG, str(folder), grace=10)
        assert not left, f"the Spark cluster left {len(left)} process(es) running after stop: {left}"
        still = [p for p in bound.values() if listening(p)]
        assert not still, f"the Spark master still listens on {still}"
