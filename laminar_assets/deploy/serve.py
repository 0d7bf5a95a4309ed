"""`laminar serve` / `make ui`: the local deployment in one command.

Starts a Spark Connect server (unless an endpoint is given) and `dagster dev` (webserver and
daemon) with `LAMINAR_SPARK_REMOTE` pointing at it, so every run the daemon launches connects to
a warm JVM instead of starting its own. Both bind to 127.0.0.1; Ctrl-C, SIGINT, SIGTERM or a closed
terminal (SIGHUP) stops both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from laminar_assets.errors import EnvironmentProblem

from .code_location_watch import CodeLocationWatch, graphql
from .connect_probe import ConnectProbe
from .connect_server import ConnectServer, ConnectServerOptions, start_connect_server
from .ports import port_in_use

# what `signal.signal` takes and gives back
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@dataclass(frozen=True)
class ServeOptions:
    """What `laminar serve` starts. `spark_remote` set: use that endpoint, start no server."""

    root: str
    dagster_home: str
    workspace: str = "workspace.yaml"
    host: str = "127.0.0.1"
    ui_port: int = 3000
    spark: ConnectServerOptions = field(default_factory=ConnectServerOptions)
    spark_remote: str | None = None
    local_spark: bool = False  # no Connect server: every run starts its own JVM (for comparison only)
    log_dir: str = ".laminar/logs"
    start_timeout: float = 180.0
    # Once the UI is up, send a scratch run of the demo graph through a Connect server started here
    # (deploy/warm_up.py), so the first real run finds its JVM warm. Never on an endpoint given.
    warm_up: bool = True
    # Reload a code location whose code server stopped answering (deploy/code_location_watch.py)
    watch_code_locations: bool = True
    # A Spark Connect server started here that exits is started again on its port, at most this many times
    # within `spark_restart_window_seconds` (more is a crash loop a restart does not cure: serve then stops)
    spark_restarts: int = 3
    spark_restart_window_seconds: float = 600.0
    # A Connect server started here is asked a question every this many seconds; one that leaves
    # `spark_probe_misses` in a row unanswered is hung: killed, and started again as one that exited
    # (deploy/connect_probe.py). 0: never asked.
    spark_probe_seconds: float = 10.0
    spark_probe_misses: int = 3


@dataclass
class Deployment:
    """The running processes; `stop()` ends them (dagster first, then Spark)."""

    dagster: subprocess.Popen
    spark: ConnectServer | None
    remote: str | None
    ui_url: str
    warm_up: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.warm_up is not None:
            _stop_group(self.warm_up, timeout=10)
        _stop_group(self.dagster, timeout=40)
        if self.spark is not None:
            self.spark.stop()


def _stop_group(process: subprocess.Popen, timeout: float) -> None:
    """Stop a process group: SIGINT first (what Ctrl-C sends; `dagster dev` shuts its webserver, daemon and
    code servers down on it in seconds, while on SIGTERM it sat out the whole timeout), then SIGTERM,
    then SIGKILL. A group that ignored SIGINT for `timeout` seconds gets at most 15 s more on SIGTERM,
    so a stop that hangs ends within `timeout` + 25 s.

    The group, not only its leader: `dagster dev` can exit while a code server it started is still
    loading and has not acted on the signal yet; that server would be left running as an orphan."""
    pgid = process.pid
    for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, min(15.0, timeout)), (signal.SIGKILL, 10.0)):
        if process.poll() is not None and not _group_alive(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            process.poll()
            return
        deadline = time.monotonic() + wait
        try:
            process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(pgid):
            return


def _group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` is running (zombies, waiting for whoever adopted them to reap
    them, do not count)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # ended while listed
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after its last ")"
        fields = stat[stat.rindex(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def start(options: ServeOptions, *, stop: threading.Event | None = None) -> Deployment:
    """Start Spark Connect (unless remote) and `dagster dev`; return once the UI answers, or as soon as
    `stop` is set (the caller then stops what was started)."""
    if not os.path.exists(options.workspace):
        raise EnvironmentProblem(f"no {options.workspace} in {os.getcwd()}: run `laminar serve` from the project "
                                 "folder (where workspace.yaml and dagster.yaml are)", workspace=options.workspace)
    if port_in_use(options.host, options.ui_port):
        raise EnvironmentProblem(f"port {options.ui_port} on {options.host} is already in use, so the Dagster UI "
                                 f"cannot start there: stop what listens on it or choose another with `--ui-port`",
                                 port=options.ui_port)
    os.makedirs(options.log_dir, exist_ok=True)
    spark = None
    remote = options.spark_remote
    if remote is None and not options.local_spark:
        spark = start_connect_server(options.spark)
        remote = spark.url
    env = _environment(options, remote)
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", options.workspace, "-h", options.host,
           "-p", str(options.ui_port)]
    log = open(os.path.join(options.log_dir, "dagster.log"), "ab")
    try:
        # SIGINT restored in the child: started from a background job, `laminar serve` inherits it ignored,
        # and `dagster dev` would then not hear the SIGINT that stops it in seconds (see _stop_group).
        dagster = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except OSError:
        if spark:
            spark.stop()
        raise
    finally:
        log.close()
    deployment = Deployment(dagster, spark, remote, f"http://{options.host}:{options.ui_port}")
    deadline = time.monotonic() + options.start_timeout
    while not port_in_use(options.host, options.ui_port):
        if stop is not None and stop.is_set():
            return deployment
        if dagster.poll() is not None or time.monotonic() > deadline:
            deployment.stop()
            raise EnvironmentProblem(f"`dagster dev` did not start (exit code {dagster.returncode}); see "
                                     f"{os.path.join(options.log_dir, 'dagster.log')}")
        time.sleep(0.5)
    if spark is not None and options.warm_up and not (stop is not None and stop.is_set()):
        deployment.warm_up = _start_warm_up(spark.url, env, options.log_dir)
    return deployment


def _environment(options: ServeOptions, remote: str | None) -> dict[str, str]:
    """The environment of `dagster dev` (and so of its runs) and of the warm-up."""
    env = {k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"}
    env.update(DAGSTER_HOME=options.dagster_home, LAMINAR_ROOT=options.root)
    if remote:
        env["LAMINAR_SPARK_REMOTE"] = remote
    return env


def _start_warm_up(remote: str, env: dict, log_dir: str) -> subprocess.Popen:
    """The warm-up (deploy/warm_up.py) in a process group of its own, logging to warm-up.log."""
    env = {k: v for k, v in env.items() if k != "LAMINAR_SPARK_REMOTE"}
    with open(os.path.join(log_dir, "warm-up.log"), "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "laminar_assets.deploy.warm_up", remote], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def serve(options: ServeOptions, *, on_ready: Callable[[Deployment], None] | None = None,
          say: Callable[[str], None] = print, stop: threading.Event | None = None) -> int:
    """Run until Ctrl-C/SIGINT, SIGTERM, SIGHUP, `stop` is set, or a process dies; always stop both.
    Meanwhile a code location whose code server stopped answering is reloaded, and `say` tells so.
    Returns an exit code. Call it from the main thread (it installs signal handlers)."""
    stop = stop or threading.Event()
    previous = _stop_on_signals(stop)
    try:
        deployment = start(options, stop=stop)
        try:
            if on_ready and not stop.is_set():
                on_ready(deployment)
            watch = CodeLocationWatch(graphql(deployment.ui_url), say) if options.watch_code_locations else None
            spark_exits: list[float] = []
            probe: ConnectProbe | None = None
            probed: ConnectServer | None = None
            while not stop.wait(1.0):
                if watch is not None and watch.due():
                    watch.look()
                if deployment.warm_up is not None and deployment.warm_up.poll() is not None:
                    deployment.warm_up = None  # finished (and reaped)
                if deployment.dagster.poll() is not None:
                    return deployment.dagster.returncode or 1
                if deployment.spark is not probed and options.spark_probe_seconds > 0:  # a new server: a new probe
                    if probe is not None:
                        probe.stop()
                    probed = deployment.spark
                    probe = None if probed is None else ConnectProbe(
                        probed.url, every=options.spark_probe_seconds, misses=options.spark_probe_misses)
                gone = None
                if probe is not None and probe.hung.is_set() and deployment.spark is not None \
                        and deployment.spark.running():
                    silent = probe.silent_seconds()
                    say(f"the Spark Connect server on {deployment.spark.url} has not answered for at least {silent:.0f} s "
                        f"({probe.misses} questions in a row; the last: {probe.why}); killing it to start a new one")
                    deployment.spark.kill()
                    gone = f"was killed after {silent:.0f} s without an answer"
                if deployment.spark is not None and not deployment.spark.running():
                    _restart_spark(deployment, options, spark_exits, say, gone=gone)
            return 0
        finally:
            if probe is not None:
                probe.stop()
            deployment.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _restart_spark(deployment: Deployment, options: ServeOptions, exits: list[float],
                   say: Callable[[str], None], *, gone: str | None = None) -> None:
    """Start the Connect server that exited (a JVM killed, out of memory) again on its port, so the runs that
    lost it succeed on their retries (a lost connection is retryable: docs/dagster.md, 'Retries') and the next
    runs find it, instead of the whole deployment going down. A server that dies while starting counts as one
    more exit. More than `spark_restarts` exits within the window: an EnvironmentProblem saying so (a crash loop
    that restarting does not cure; serve then stops everything)."""
    assert deployment.spark is not None
    spark_options = deployment.spark.options
    log = spark_options.log_path
    gone = gone or f"exited (code {deployment.spark.process.returncode})"
    if deployment.warm_up is not None:  # it warmed the server that is gone: scratch work, stopped at once
        _stop_group(deployment.warm_up, timeout=2)
        deployment.warm_up = None
    while True:
        now = time.monotonic()
        exits[:] = [t for t in exits if now - t < options.spark_restart_window_seconds] + [now]
        if len(exits) > options.spark_restarts:
            raise EnvironmentProblem(
                f"the Spark Connect server {gone}: {len(exits)} exits within "
                f"{options.spark_restart_window_seconds:.0f} s, more than the {options.spark_restarts} restarts "
                f"`laminar serve` makes, so a restart does not cure it; stopped everything (see {log})", log=log)
        say(f"the Spark Connect server {gone} (see {log}); starting a new one on {spark_options.url} "
            f"(restart {len(exits)} of at most {options.spark_restarts} within "
            f"{options.spark_restart_window_seconds:.0f} s)")
        started = time.monotonic()
        try:
            deployment.spark = start_connect_server(spark_options)
        except EnvironmentProblem as exc:  # died while starting (killed again, out of memory): one more exit
            say(f"the new Spark Connect server did not start: {exc.message}")
            gone = "exited while starting"
            continue
        break
    say(f"the Spark Connect server is up again on {deployment.spark.url} after {time.monotonic() - started:.0f} s; "
        "runs that lost it retry")
    if options.warm_up:
        deployment.warm_up = _start_warm_up(deployment.spark.url, _environment(options, deployment.spark.url),
                                            options.log_dir)


def _stop_on_signals(stop: threading.Event) -> dict[int, SignalHandler]:
    """Make SIGINT, SIGTERM and SIGHUP set `stop`; returns the handlers they had.

    The servers run in sessions of their own (so a Ctrl-C reaches them only through this process,
    which stops them in order), so a signal this process does not handle would leave them running
    as orphans. SIGINT is handled even when inherited as ignored: a shell starts a background job
    (`laminar serve &`, `make ui &` in a script) with SIGINT ignored, and `kill -INT` then did nothing
    at all. SIGHUP stays ignored when it was (`nohup`)."""
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    return {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
