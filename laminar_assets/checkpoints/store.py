"""Durable storage of watermarks and partition leases, on disk beside the tables.

Layout under the storage root:
    _laminar/checkpoints/<flow>/<partition>.json   watermark (atomic replace)
    _laminar/locks/<flow>/<partition>.lock         lease of the run processing it
    _laminar/sweeps/<flow>.json                    source versions the quarantine sweep has read
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from laminar_assets.errors import CheckpointError, ConcurrentRunError

from .watermark import Watermark


def _safe(key: str) -> str:
    return key.replace(":", "-").replace("/", "_")


class CheckpointStore:
    """Reads and writes watermarks and leases under `<root>/_laminar`."""

    def __init__(self, root: str, *, lease_seconds: float = 6 * 3600) -> None:
        self.root = root
        self.base = os.path.join(root, "_laminar")
        self.lease_seconds = lease_seconds

    def _path(self, flow: str, partition: str) -> str:
        return os.path.join(self.base, "checkpoints", flow, f"{_safe(partition)}.json")

    def _lock_path(self, flow: str, partition: str) -> str:
        return os.path.join(self.base, "locks", flow, f"{_safe(partition)}.lock")

    def load(self, flow: str, partition: str) -> Watermark | None:
        path = self._path(flow, partition)
        try:
            with open(path, encoding="utf-8") as fh:
                return Watermark.from_json(json.load(fh))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise CheckpointError(
                f"watermark file is unreadable: {exc}; delete it to force a refill of this partition",
                flow=flow, partition=partition, path=path,
            ) from exc

    def save(self, mark: Watermark) -> None:
        """Atomically replace the watermark file (write, fsync, rename)."""
        path = self._path(mark.flow, mark.partition)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        stamped = mark.with_(updated_at=datetime.now(UTC).isoformat())
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(stamped.to_json(), fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def load_sweep(self, flow: str, spec_hash: str) -> dict[str, int]:
        """Source versions whose partition-less rows `flow` has quarantined under this spec hash
        ({} if none yet, or if the rules, bounds or event time changed since)."""
        path = os.path.join(self.base, "sweeps", f"{flow}.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if data.get("spec_hash") != spec_hash:
                return {}
            return {str(k): int(v) for k, v in data["versions"].items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CheckpointError(f"sweep progress file is unreadable: {exc}; delete it and the next run sweeps "
                                  "the sources again (nothing is recorded twice)", flow=flow, path=path) from exc

    def save_sweep(self, flow: str, spec_hash: str, versions: dict[str, int]) -> None:
        path = os.path.join(self.base, "sweeps", f"{flow}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"spec_hash": spec_hash, "versions": versions}, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def partitions(self, flow: str) -> list[str]:
        """Partition keys with a watermark file for `flow`."""
        folder = os.path.join(self.base, "checkpoints", flow)
        if not os.path.isdir(folder):
            return []
        out = []
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    out.append(json.load(fh)["partition"])
        return out

    @contextmanager
    def lease(self, flow: str, partition: str, run_id: str) -> Iterator[None]:
        """Hold the exclusive lease of one (flow, partition) for the duration of a run."""
        path = self._lock_path(flow, partition)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._acquire(path, flow, partition, run_id)
        try:
            yield
        finally:
            try:
                with open(path, encoding="utf-8") as fh:
                    holder = json.load(fh).get("run_id")
                if holder == run_id:
                    os.remove(path)
            except (FileNotFoundError, ValueError):
                pass

    def _acquire(self, path: str, flow: str, partition: str, run_id: str) -> None:
        body = json.dumps({"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self._stale(path):
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass
                    continue
                holder = self._holder(path)
                raise ConcurrentRunError(
                    f"partition is being processed by another run ({holder}); wait for it to finish, "
                    f"or delete {path} if that run is dead",
                    flow=flow, partition=partition,
                ) from None
            with os.fdopen(fd, "w") as fh:
                fh.write(body)
            return
        raise ConcurrentRunError("could not take the partition lease", flow=flow, partition=partition)

    def _holder(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            return f"run {data.get('run_id')} pid {data.get('pid')} on {data.get('host')}"
        except (OSError, ValueError):
            return "unknown holder"

    def _stale(self, path: str) -> bool:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return time.time() - os.path.getmtime(path) > 60
        if data.get("host") == socket.gethostname():
            try:
                os.kill(int(data.get("pid")), 0)
            except ProcessLookupError:
                return True
            except (PermissionError, TypeError, ValueError):
                return False
            return False
        return time.time() - float(data.get("started", 0)) > self.lease_seconds
