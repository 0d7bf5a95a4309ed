"""The GCS emulator for the tests (laminar_assets/deploy/local_gcs.py), on this test process's own ports."""

from __future__ import annotations

from contextlib import contextmanager

from laminar_assets.deploy.local_gcs import GcsServer
from laminar_assets.deploy.local_gcs import start_fake_gcs as _start
from tests.deploy.processes import free_port

__all__ = ["GcsServer", "start_fake_gcs", "using_gcs"]


def start_fake_gcs(timeout: float = 30.0) -> GcsServer:
    """fake-gcs-server and its shim on ports from this test process's span (`free_port`)."""
    return _start(timeout, ports=(free_port(), free_port()))


@contextmanager
def using_gcs(server: GcsServer):
    """This process reaches `server` for every gs:// URI no engine mounted a store for, while the block runs."""
    from laminar_assets import storage

    with storage.mounted("gs://", server.options):
        yield server
