"""A Spark Connect server on 127.0.0.1, started from the pyspark wheel, so launched runs never start a JVM.

Each Dagster run is a new process; with a local master every run would start its own JVM and run
every query cold (tens of seconds). Runs instead connect to one long-lived server (`sc://...`),
whose JVM stays warm between runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from laminar_assets import storage
from laminar_assets.engine import SparkOptions
from laminar_assets.engine.spark import check_java, check_metastore, jvm_conf, metastore_env, session_conf
from laminar_assets.errors import EnvironmentProblem

from .ports import ends_with_this_process, port_in_use


@dataclass(frozen=True)
class ConnectServerOptions:
    """Where the server listens and how big its driver is. `spark` gives the session settings."""

    host: str = "127.0.0.1"
    port: int = 15002
    log_path: str = ".laminar/logs/spark-connect.log"
    start_timeout: float = 180.0
    spark: SparkOptions = field(default_factory=lambda: SparkOptions(driver_memory="4g"))

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"


SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    """The Spark distribution inside the installed pyspark wheel (it ships bin/spark-submit and the
    Spark Connect server's jar)."""
    import glob

    import pyspark

    home = os.path.dirname(pyspark.__file__)
    if not os.path.exists(os.path.join(home, "bin", "spark-submit")) or \
            not glob.glob(os.path.join(home, "jars", "spark-connect_*.jar")):
        raise EnvironmentProblem(f"the pyspark install at {home} has no bin/spark-submit or no Spark Connect jar; "
                                 "reinstall with `make install`")
    return home


class ConnectServer:
    """A running server process; `stop()` (or leaving the `with` block) ends it and its JVM."""

    def __init__(self, options: ConnectServerOptions, process: subprocess.Popen) -> None:
        self.options = options
        self.process = process

    @property
    def url(self) -> str:
        return self.options.url

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `timeout` seconds."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                return
        # The launcher script can exit before the JVM it started has shut down: wait for the port.
        deadline = time.monotonic() + timeout
        while port_in_use(self.options.host, self.options.port) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the server's process group at once: a hung JVM (stopped, deadlocked) answers no SIGTERM."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_command(options: ConnectServerOptions) -> list[str]:
    """The server's command line: `spark-submit` of the Spark Connect server class, in the foreground
    (what sbin/start-connect-server.sh does, which not every pyspark wheel ships), so its lifetime is ours."""
    conf = {
        **jvm_conf(options.spark, secrets=False), **session_conf(options.spark),
        "spark.connect.grpc.binding.address": options.host,
        "spark.connect.grpc.binding.port": str(options.port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.app.name": "laminar-connect",
    }
    args = [os.path.join(spark_home(), "bin", "spark-submit"), "--class", SERVER_CLASS, "--name", "Spark Connect server",
            "--master", options.spark.master, "--driver-memory", options.spark.driver_memory]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "spark-internal"]


def start_connect_server(options: ConnectServerOptions | None = None) -> ConnectServer:
    """Start a server and wait until it accepts connections; a clear error if it cannot."""
    options = options or ConnectServerOptions()
    check_java()
    check_metastore(options.spark.metastore)  # a metastore database that refuses: one line, before the JVM
    if port_in_use(options.host, options.port):
        raise EnvironmentProblem(
            f"port {options.port} on {options.host} is already in use, so the Spark Connect server cannot "
            f"start there: stop what listens on it (`ss -ltnp | grep {options.port}`) or choose another "
            "port with `--spark-port`", port=options.port)
    os.makedirs(os.path.dirname(os.path.abspath(options.log_path)), exist_ok=True)
    # the object store's credentials reach the server's s3a through its environment (never argv), and so does
    # a metastore database's password (its Hive setting refers to it: engine/spark/metastore.py)
    env = {**os.environ, **storage.env(), **metastore_env(options.spark.metastore), "SPARK_HOME": spark_home(),
           "SPARK_NO_DAEMONIZE": "1"}
    with open(options.log_path, "ab") as log:
        process = subprocess.Popen(server_command(options), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                   preexec_fn=ends_with_this_process())
    server = ConnectServer(options, process)
    deadline = time.monotonic() + options.start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EnvironmentProblem(
                f"the Spark Connect server exited with code {process.returncode} before listening on "
                f"{options.host}:{options.port}; last lines of {options.log_path}: {_tail(options.log_path)}",
                log=options.log_path)
        if port_in_use(options.host, options.port):
            return server
        time.sleep(0.5)
    server.stop()
    raise EnvironmentProblem(f"the Spark Connect server did not listen on {options.host}:{options.port} within "
                             f"{options.start_timeout:.0f} s; see {options.log_path}", log=options.log_path)


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as fh:
            return " | ".join(line.strip() for line in fh.readlines()[-lines:])
    except OSError:
        return "(no log)"
