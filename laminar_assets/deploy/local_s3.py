"""Run a command against a local S3 server: the demo, or the deployment, with the lake in a bucket.

Usage: python -m laminar_assets.deploy.local_s3 [--bucket NAME] [--seconds N] -- COMMAND [ARGS...]

Starts moto's S3 server (moto[server], installed with the project's dev extras) on 127.0.0.1,
creates the bucket, and runs COMMAND with the lake at s3://NAME/lake: LAMINAR_ROOT and the AWS
variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION) point it
there, as they would point it at a real bucket. The server stops when the command ends, when this
process gets SIGINT or SIGTERM, or after --seconds (default: no limit); its data lives in memory
and goes with it. `make demo-s3` and `make ui-s3` use this.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from laminar_assets.storage import ObjectStoreOptions

KEY, SECRET = "laminar-local", "laminar-local-secret"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", default="laminar-demo")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop everything after this long (0: no limit)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(moto):
        print("error: moto_server is not installed: `make install` installs it (the project's dev extras)",
              file=sys.stderr)
        return 1
    port = _free_port()
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
    child: subprocess.Popen | None = None

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                print(f"error: moto_server did not listen on 127.0.0.1:{port} within 30 s", file=sys.stderr)
                return 1
            time.sleep(0.2)
        store = ObjectStoreOptions(endpoint=f"http://127.0.0.1:{port}", region="us-east-1", access_key_id=KEY,
                                   secret_access_key=SECRET, path_style=True)
        store.client().create_bucket(Bucket=args.bucket)
        root = f"s3://{args.bucket}/lake"
        env = {**os.environ, **store.as_env(), "LAMINAR_ROOT": root}
        print(f"local S3 server at {store.endpoint}; lake at {root}", flush=True)
        child = subprocess.Popen(command, env=env)
        try:
            return child.wait(timeout=args.seconds or None)
        except subprocess.TimeoutExpired:
            print(f"stopping after {args.seconds:.0f} s", file=sys.stderr)
            child.send_signal(signal.SIGINT)
            return child.wait(60)
    except KeyboardInterrupt:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            child.wait(120)
        return 130
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(15)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
