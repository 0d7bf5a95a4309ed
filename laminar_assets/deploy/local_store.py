"""Run a command against a local object store: the demo, or the deployment, with the lake in a bucket.

Usage: python -m laminar_assets.deploy.local_store {s3,gcs,azure} [--bucket NAME] [--seconds N]
       [--latency-ms MS] -- COMMAND [ARGS...]

Starts the store's emulator on 127.0.0.1, in memory, makes a bucket (a container on Azure) and runs
COMMAND with the lake in it: LAMINAR_ROOT and the store's usual environment variables point there, as
they would point it at a real bucket, so nothing else changes (LAMINAR_LOCAL_STORE names the emulator, so
`laminar demo` does not send you to `make ui` for a lake that goes with it).

- `s3`: moto's S3 server (deploy/local_s3.py); AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  AWS_REGION; the lake at s3://NAME/lake. `--latency-ms` makes it sleep that long before each request
  (S3 in-region: about 20 ms to the first byte).
- `gcs`: fake-gcs-server behind its shim (deploy/local_gcs.py); STORAGE_EMULATOR_HOST,
  GOOGLE_CLOUD_PROJECT; the lake at gs://NAME/lake.
- `azure`: Azurite's blob service (deploy/azurite.py; `make test-azurite` installs it, Node.js needed);
  AZURE_STORAGE_ENDPOINT, AZURE_STORAGE_ACCOUNT_KEY (the emulator's published development key); the lake
  at abfss://NAME@devstoreaccount1.dfs.core.windows.net/lake.

The emulator stops when the command ends, when this process gets SIGINT or SIGTERM, or after --seconds
(default: no limit); its data goes with it. The exit code is the command's (128 + N when a signal N ended it;
127 when it cannot be found, 126 when it cannot be run; 124 when --seconds ended it; 130 on Ctrl-C). A bucket
name the store would refuse is refused before anything starts. `make demo-s3`, `make ui-s3`,
`make demo-gcs` and `make demo-azure` use this.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from laminar_assets.errors import EnvironmentProblem, LaminarError

__all__ = ["STORES", "Started", "main"]


@dataclass
class Started:
    """A running emulator: the lake's root in it, the environment that reaches it, and how to stop it."""

    root: str
    env: dict[str, str]
    endpoint: str
    stop: Callable[[], None]


def _s3(bucket: str, latency_ms: float) -> Started:
    from .local_s3 import LocalS3

    server = LocalS3(latency_ms=latency_ms).start()
    try:
        root = f"{server.create_bucket(bucket)}/lake"
    except BaseException:
        server.stop()
        raise
    return Started(root, server.options.as_env(), server.endpoint, server.stop)


def _gcs(bucket: str, latency_ms: float) -> Started:
    from .local_gcs import start_fake_gcs

    server = start_fake_gcs()
    try:
        root = server.bucket("lake", name=bucket)
    except BaseException:
        server.stop()
        raise
    return Started(root, server.options.as_env(), server.endpoint, server.stop)


def _azure(bucket: str, latency_ms: float) -> Started:
    from laminar_assets.storage.azure import AzureStore

    from .azurite import Azurite

    server = Azurite().start()
    try:
        root = server.container("lake", name=bucket)
    except BaseException:
        server.stop()
        raise
    return Started(root, AzureStore(server.options).env(), server.endpoint, server.stop)


STORES: dict[str, Callable[[str, float], Started]] = {"s3": _s3, "gcs": _gcs, "azure": _azure}
"""Each scheme's emulator: started with a bucket name and a latency (S3 only), in memory on 127.0.0.1."""

# What each store takes as a bucket (an Azure container) name, checked before its emulator starts; the real
# stores' rules, which the emulators enforce only in part (moto takes upper case)
BUCKET_NAMES = {
    "s3": (re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"),
           "3-63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or a digit"),
    "gcs": (re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$"),
            "3-63 lower-case letters, digits, dots, hyphens and underscores, starting and ending with a letter or "
            "a digit"),
    "azure": (re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"),
              "3-63 lower-case letters, digits and single hyphens, starting and ending with a letter or a digit"),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m laminar_assets.deploy.local_store",
                                     usage="%(prog)s {s3,gcs,azure} [options] -- COMMAND [ARGS...]",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("store", choices=sorted(STORES), help="which emulator: s3 (moto), gcs (fake-gcs-server), "
                                                              "azure (Azurite)")
    parser.add_argument("--bucket", default="laminar-demo", help="the bucket (an Azure container) to make")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop everything after this long (0: no limit)")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="s3 only: slept before each request, as a real store's latency (S3 in-region ~20)")
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("give the command to run after --")
    if args.latency_ms and args.store != "s3":
        parser.error(f"--latency-ms is the S3 server's only; {args.store}'s emulator has none")
    if args.seconds < 0:
        parser.error(f"--seconds must be 0 (no limit) or more, not {args.seconds:g}")
    pattern, rule = BUCKET_NAMES[args.store]
    if not pattern.match(args.bucket):
        parser.error(f"--bucket {args.bucket!r} is not a {args.store} bucket name: {rule}")
    child: subprocess.Popen | None = None
    started: Started | None = None

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    # started from a background job, this process inherits SIGINT ignored: Ctrl-C would then leave the emulator
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            started = STORES[args.store](args.bucket, args.latency_ms)
        except EnvironmentProblem as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except LaminarError as exc:
            parser.error(exc.message)
        latency = f" ({args.latency_ms:g} ms per request)" if args.latency_ms else ""
        print(f"local {args.store} store at {started.endpoint}{latency}; lake at {started.root}", flush=True)
        env = {**os.environ, **started.env, "LAMINAR_ROOT": started.root, "LAMINAR_LOCAL_STORE": args.store}
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:  # as a shell says it: 127 not found, 126 found but not runnable
            print(f"error: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        try:
            return _exit_code(child.wait(timeout=args.seconds or None))
        except subprocess.TimeoutExpired:
            print(f"stopping after {args.seconds:g} s", file=sys.stderr)
            child.send_signal(signal.SIGINT)
            child.wait(60)
            return 124  # as timeout(1): the time limit ended it
    except KeyboardInterrupt:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            child.wait(120)
        return 130
    finally:
        if started is not None:
            started.stop()


def _exit_code(returncode: int) -> int:
    """The command's exit code as a shell gives it: 128 + N for a command a signal N ended."""
    return 128 - returncode if returncode < 0 else returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
