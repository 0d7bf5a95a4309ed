"""Azurite, Microsoft's Azure Storage emulator (npm), for the tests and a local Azure lake.

Usage: python -m laminar_assets.deploy.azurite install      (run by `make test-azurite`)

`install` puts the pinned Azurite into `<venv>/share/laminar/azurite` once with npm (Node.js and npm
must be on PATH; a folder that already holds the pinned version is kept). `Azurite` runs its blob
service on 127.0.0.1 (a free port), in memory, as a process group of its own, stopped by `stop`
(also as a context manager, and on failure to start); `options` reach it as an `AzureOptions` with
the emulator's well-known account (`devstoreaccount1`) and key.

Azurite 3.37.0 is the first release that honours List Blobs' `startFrom` (service version 2026-02-06),
which deltalake's Azure client (object_store) sends to read a Delta log from a version on: on 3.35
the listing came back whole and the third commit of any table failed ("Invalid table version: 1").
Its package asks for Node.js 22; npm installs it on 20 with a warning, and the blob service runs
there (the tests run it on this machine's Node.js 20). It serves the Blob API only: no DFS (ADLS
Gen2) endpoint, see docs/known-limits.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

from laminar_assets.errors import EnvironmentProblem
from laminar_assets.storage.azure import EMULATOR_ACCOUNT, EMULATOR_KEY, AzureOptions

from .ports import ends_with_this_process, free_port, stop_group, wait_listening

VERSION = "3.37.0"


def folder(prefix: str | None = None) -> str:
    return os.path.join(prefix or sys.prefix, "share", "laminar", "azurite")


def main_script(prefix: str | None = None) -> str:
    return os.path.join(folder(prefix), "node_modules", "azurite", "dist", "src", "blob", "main.js")


def installed(prefix: str | None = None) -> str | None:
    """The blob service's script when the pinned Azurite is installed, else None."""
    package = os.path.join(folder(prefix), "node_modules", "azurite", "package.json")
    try:
        with open(package) as fh:
            if json.load(fh).get("version") != VERSION:
                return None
    except (OSError, ValueError):
        return None
    script = main_script(prefix)
    return script if os.path.isfile(script) else None



def install(prefix: str | None = None, timeout: float = 600.0) -> str:
    """Install the pinned Azurite with npm (once); returns the blob service's script."""
    found = installed(prefix)
    if found:
        return found
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise EnvironmentProblem("Azurite needs Node.js (>= 20) and npm on PATH: install them (Debian: apt-get "
                                 "install nodejs npm), then `make test-azurite`")
    target = folder(prefix)
    os.makedirs(target, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--omit=dev", "--prefix", target,
                               f"azurite@{VERSION}"], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"npm install azurite@{VERSION} took over {timeout:g} s: check that the npm "
                                 "registry is reachable, then `make test-azurite` again") from None
    found = installed(prefix)
    if done.returncode != 0 or not found:
        tail = " ".join((done.stderr or done.stdout or "").split()[-40:])
        raise EnvironmentProblem(f"npm install azurite@{VERSION} into {target} failed ({done.returncode}): {tail}")
    return found


class Azurite:
    """Azurite's blob service on 127.0.0.1, in memory (`start`, `stop`, or a context manager)."""

    def __init__(self, port: int | None = None, *, log: str | None = None) -> None:
        self.port = port or free_port()
        self.log = log
        self.process: subprocess.Popen | None = None
        self.workspace: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> AzureOptions:
        return AzureOptions(endpoint=self.endpoint, account_key=EMULATOR_KEY)

    def container(self, prefix: str = "lake", *, name: str | None = None) -> str:
        """A new container (`name`, or a random one); returns its abfss:// URI with `prefix` (`AzureStore`
        normalises the emulator's account)."""
        from laminar_assets.storage.azure import AzureStore

        name = name or f"t{uuid.uuid4().hex[:12]}"
        AzureStore(self.options).service(EMULATOR_ACCOUNT).create_container(name)
        return f"abfss://{name}@{EMULATOR_ACCOUNT}.dfs.core.windows.net/{prefix}"

    def start(self, timeout: float = 30.0) -> Azurite:
        script = installed()
        if script is None:
            raise EnvironmentProblem(f"Azurite {VERSION} is not installed: run `make test-azurite` "
                                     "(python -m laminar_assets.deploy.azurite install)")
        self.workspace = tempfile.mkdtemp(prefix="laminar-azurite-")
        # LAMINAR_AZURITE_DEBUG=<file>: Azurite's own log of every request (what a client sent)
        debug = ["--debug", os.environ["LAMINAR_AZURITE_DEBUG"]] if os.environ.get("LAMINAR_AZURITE_DEBUG") else []
        out = open(self.log or os.devnull, "w")  # noqa: SIM115  (closed below; the child keeps its copy)
        try:
            self.process = subprocess.Popen(
                ["node", script, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
                 *debug, "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=ends_with_this_process(), cwd=self.workspace)
        finally:
            out.close()
        try:
            wait_listening(self.port, "Azurite", timeout=timeout, exited=self.process.poll,
                           see=f"; its log: {self.log}" if self.log else "")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_group(process)
        if self.workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None

    def __enter__(self) -> Azurite:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if argv[:1] != ["install"]:
        print("usage: python -m laminar_assets.deploy.azurite install", file=sys.stderr)
        return 2
    try:
        install()
    except EnvironmentProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"azurite {VERSION}: {folder()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
