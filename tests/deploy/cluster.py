"""A Spark standalone cluster (one master, N workers) from the pyspark wheel, on 127.0.0.1, for tests.

The same `spark-class` commands the README's "Deploying" section gives; every process carries
LAMINAR_TEST_CLUSTER=<folder> in its environment, so `stop` can find and kill all of them (workers fork
executor JVMs) even if one of them ignored SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.processes import free_port, kill_tagged, listening, wait_for

TAG = "LAMINAR_TEST_CLUSTER"


@dataclass(frozen=True)
class Cluster:
    url: str          # spark://127.0.0.1:<port>, for LAMINAR_SPARK_MASTER / SparkResource(master=...)
    ui_port: int      # the master's web UI (and its /json/ status)
    folder: Path      # logs and the workers' work dirs
    env: dict         # what a driver on this machine needs: loopback, the same Python as the executors

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.status()["workers"])
        except OSError:
            return 0


def _spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


@contextmanager
def standalone_cluster(folder: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", python: str):
    """Start a master and `workers` workers, wait until all registered, yield a `Cluster`, always stop."""
    folder.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    env = {**os.environ, TAG: str(folder), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python,
           "SPARK_LOG_DIR": str(folder), "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    env.pop("LAMINAR_SPARK_REMOTE", None)
    url = f"spark://127.0.0.1:{port}"
    cluster = Cluster(url=url, ui_port=ui_port, folder=folder,
                      env={"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python, TAG: str(folder)})
    procs, logs = [], []

    def launch(name: str, *args: str) -> None:
        log = open(folder / f"{name}.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen([_spark_class(), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    try:
        launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(ui_port))
        wait_for(lambda: listening(port) and listening(ui_port), 120, "the Spark master",
                 alive=lambda: procs[0].poll() is None)
        for i in range(workers):
            launch(f"worker{i + 1}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                   "--cores", str(cores), "--memory", memory, "--webui-port", "0",
                   "--work-dir", str(folder / f"work{i + 1}"), url)
        wait_for(lambda: cluster.alive_workers() == workers, 120, f"{workers} Spark workers to register",
                 alive=lambda: all(p.poll() is None for p in procs))
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
        assert not listening(port), f"the Spark master still listens on {port}"
