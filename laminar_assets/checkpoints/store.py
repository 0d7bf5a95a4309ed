"""Durable storage of watermarks and leases, beside the tables (a folder or a bucket).

Layout under the storage root:
    _laminar/checkpoints/<flow>/<partition>.json   watermark (replaced atomically), naming the run that holds
                                                   the partition while one does (`Watermark.holder`)
    _laminar/locks/<flow>/_sweep.lock              lease of the run sweeping the flow's partition-less rows
    _laminar/sweeps/<flow>.json                    source versions the quarantine sweep has read

No step relies on an atomic rename, which an object store does not have (laminar_assets.storage):
- a watermark is one object, replaced by a single write (a rename on a local disk, one PUT on S3). A run
  writes it only conditionally on the version it read or last wrote (`write_if`: `If-Match`, or
  `If-None-Match: *` where there is none), naming itself as holder until its last write: the watermark is
  the partition's lease, and the run's first write of it (its intent) is the claim. A holder is gone by the
  lease rules below (`holder_gone`);
- a lease (the sweep's) is taken with a put-if-absent (O_EXCL on a local disk, `If-None-Match: *` on S3); a
  stale one is taken over with a compare-and-swap on the version read (`If-Match`), so of two runs
  that find it stale one wins; it is released with a delete conditional on the holder's own version.
  A lease is stale when it is older than `lease_seconds` (on every host), or when its holder on this
  host is gone: no process has its pid, or the process that has it started at another time than the
  holder did (a pid reused after a restart, common in containers). A lease naming no pid expires by age.
  A lease of this very process is stale when the run it names has ended here: its release failed (a
  store that stopped answering), and the process itself knows no run of it holds the lease any more.
- the sweep's progress is replaced under the flow's `_sweep` lease, or, when the sweep has nothing to
  record, with one write conditional on the version this store last read or wrote (`advance_sweep`).
A lease that expires under a slow run cannot make two runs commit one partition: every commit
carries the partition's run sequence as a Delta app transaction and is refused when the table
already holds that sequence (the engine's protocol).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime

from laminar_assets import storage
from laminar_assets.errors import CheckpointError, ConcurrentRunError, StorageError

from .watermark import Holder, Watermark

log = logging.getLogger(__name__)

# Leases whose release failed in this process, as (lease path, run id): the run has ended here, so
# such a lease is stale for this process whatever its age (see the module's docstring).
_abandoned_lock = threading.Lock()
_abandoned: set[tuple[str, str]] = set()


def _abandoned_here(data: bytes, path: str) -> bool:
    """Whether the lease at `path` names a run of this very process whose release failed (the run has
    ended here, so nobody holds it)."""
    try:
        info = json.loads(data)
        mine = int(info.get("pid")) == os.getpid() and info.get("process_started") == process_started(os.getpid())
    except (ValueError, TypeError, AttributeError):
        return False
    with _abandoned_lock:
        return mine and (path, str(info.get("run_id"))) in _abandoned


def _safe(key: str) -> str:
    return key.replace(":", "-").replace("/", "_")


class CheckpointStore:
    """Reads and writes watermarks and leases under `<root>/_laminar`."""

    def __init__(self, root: str, *, lease_seconds: float = 6 * 3600) -> None:
        self.root = root
        self.base = storage.join(root, "_laminar")
        self.lease_seconds = lease_seconds
        # What this store last read or wrote, by path: (tag, watermark). `load_listed` serves a watermark
        # from here only when a listing shows the object still has that tag (the same bytes).
        self._known: dict[str, tuple[str, Watermark]] = {}
        # flow -> (spec hash, versions, the progress object's tag: None when none was written) last read or written
        self._sweeps: dict[str, tuple[str, dict[str, int], str | None]] = {}

    def _path(self, flow: str, partition: str) -> str:
        return storage.join(self.base, "checkpoints", flow, f"{_safe(partition)}.json")

    def _lock_path(self, flow: str, partition: str) -> str:
        return storage.join(self.base, "locks", flow, f"{_safe(partition)}.lock")

    def _sweep_path(self, flow: str) -> str:
        return storage.join(self.base, "sweeps", f"{flow}.json")

    def load(self, flow: str, partition: str) -> Watermark | None:
        return self.load_tagged(flow, partition)[0]

    def load_tagged(self, flow: str, partition: str) -> tuple[Watermark | None, str | None]:
        """The watermark and the tag of the version read (None, None: there is none), for `write_if`."""
        return self._loaded(flow, partition, storage.read_tagged(self._path(flow, partition)))

    def _loaded(self, flow: str, partition: str, found: tuple[bytes, str] | None) -> tuple[Watermark | None, str | None]:
        path = self._path(flow, partition)
        if found is None:
            self._known.pop(path, None)
            return None, None
        mark = self._parse(found[0], flow, partition, path)
        self._known[path] = (found[1], mark)
        return mark, found[1]

    @staticmethod
    def _parse(data: bytes, flow: str, partition: str, path: str) -> Watermark:
        try:
            return Watermark.from_json(json.loads(data))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(
                f"watermark file is unreadable: {exc}; delete it to force a refill of this partition",
                flow=flow, partition=partition, path=path,
            ) from exc

    def load_listed(self, flow: str, partitions: list[str]) -> dict[str, Watermark | None]:
        """`load` of several partitions from one listing of the flow's watermarks (one request on S3 for
        a range of up to 1000 partitions): a watermark whose tag is the one this store last read or
        wrote is not read again (a tag names the object's bytes); the others are read."""
        return {k: mark for k, (mark, _tag) in self.load_listed_tagged(flow, partitions).items()}

    def load_listed_tagged(self, flow: str, partitions: list[str]) -> dict[str, tuple[Watermark | None, str | None]]:
        """`load_listed`, with the tag of each watermark as listed or read (None: there is none), for `write_if`."""
        names = {partition: f"{_safe(partition)}.json" for partition in partitions}
        folder = storage.join(self.base, "checkpoints", flow)
        first, last = min(names.values()), max(names.values())
        listed = dict(storage.list_tagged(folder, after=first[:-1], until=last))
        out: dict[str, tuple[Watermark | None, str | None]] = {}
        unread = []
        for partition, name in names.items():
            path, tag = self._path(flow, partition), listed.get(name)
            known = self._known.get(path)
            if tag is None:
                out[partition] = (None, None)
            elif known is not None and known[0] == tag:
                out[partition] = (known[1], tag)
            else:
                unread.append(partition)
        # the others read side by side (a process that has not read them yet: every one)
        for partition, found in zip(unread, storage.read_many_tagged([self._path(flow, p) for p in unread])):
            out[partition] = self._loaded(flow, partition, found)
        return {partition: out[partition] for partition in names}

    def save(self, mark: Watermark) -> None:
        """Replace the watermark atomically (readers see the old one or the new one, never a mix), whatever
        version is there: for tools and tests; a run writes with `write_if`."""
        stamped = mark.with_(updated_at=datetime.now(UTC).isoformat())
        path = self._path(mark.flow, mark.partition)
        self._known.pop(path, None)
        tag = storage.write(path, json.dumps(stamped.to_json(), indent=1, sort_keys=True).encode())
        self._known[path] = (tag, stamped)

    def write_if(self, mark: Watermark, tag: str | None) -> str | None:
        """Write `mark` only if its object is still the version `tag` names (None: only if there is no
        watermark yet); the new version's tag, or None when another writer changed it since (nothing is
        written). One request; readers see the old watermark or the new one, never a mix."""
        stamped = mark.with_(updated_at=datetime.now(UTC).isoformat())
        path = self._path(mark.flow, mark.partition)
        data = json.dumps(stamped.to_json(), indent=1, sort_keys=True).encode()
        new = storage.create_tagged(path, data) if tag is None else storage.replace_tagged(path, data, tag)
        if new is None:
            self._known.pop(path, None)
            return None
        self._known[path] = (new, stamped)
        return new

    def delete_if(self, flow: str, partition: str, tag: str) -> bool:
        """Delete the watermark only if it is still the version `tag` names (a claim undone)."""
        path = self._path(flow, partition)
        self._known.pop(path, None)
        return storage.delete(path, tag=tag)

    def holder(self, run_id: str) -> Holder:
        """`run_id` of this process, as a watermark names the run holding its partition."""
        return Holder(run_id=run_id, host=socket.gethostname(), started=time.time(), pid=os.getpid(),
                      process_started=process_started(os.getpid()))

    def holder_gone(self, holder: Holder, flow: str, partition: str) -> bool:
        """Whether the run a watermark names as its holder holds it no more: by the lease rules (the module's
        docstring), or a run of this process that ended without clearing it (`abandon`)."""
        info = asdict(holder)
        path = self._path(flow, partition)
        return self._stale_info(info) or _abandoned_here(json.dumps(info).encode(), path)

    def abandon(self, flow: str, partition: str, run_id: str) -> None:
        """The run `run_id` of this process ended still named as the partition's holder (a kill simulated in
        tests, a store that stopped answering its last write): this process's runs take the partition over."""
        with _abandoned_lock:
            _abandoned.add((self._path(flow, partition), run_id))

    @contextmanager
    def hold(self, flow: str, partition: str, run_id: str, spec_hash: str = "") -> Iterator[None]:
        """Hold one partition for the block as a run does (its watermark naming `run_id` of this process as holder,
        written over the version read; a watermark with nothing committed where there is none), then give it back
        as it was: a run of the partition meanwhile is refused. For maintenance by hand, and tests.
        `ConcurrentRunError` when a live run holds it, or writes it between the read and the claim."""
        mark, tag = self.load_tagged(flow, partition)
        if mark is not None and mark.holder is not None and not self.holder_gone(mark.holder, flow, partition):
            raise ConcurrentRunError(f"partition is being processed by another run ({self.describe(mark.holder)})",
                                     flow=flow, partition=partition)
        held = (mark or Watermark(flow, partition, spec_hash, {}, 0)).with_(holder=self.holder(run_id))
        mine = self.write_if(held, tag)
        if mine is None:
            raise ConcurrentRunError("partition is being processed by another run, which wrote its watermark "
                                     "just now", flow=flow, partition=partition)
        try:
            yield
        finally:
            if mark is None:
                self.delete_if(flow, partition, mine)
            else:
                self.write_if(mark.with_(holder=None), mine)

    @staticmethod
    def describe(holder: Holder) -> str:
        return f"run {holder.run_id} pid {holder.pid} on {holder.host}"

    def load_sweep(self, flow: str, spec_hash: str) -> dict[str, int]:
        """Source versions whose partition-less rows `flow` has quarantined under this spec hash
        ({} if none yet, or if the rules, bounds or event time changed since)."""
        path = self._sweep_path(flow)
        self._sweeps.pop(flow, None)
        found = storage.read_tagged(path)
        if found is None:
            return {}
        try:
            data = json.loads(found[0])
            if data.get("spec_hash") != spec_hash:
                return {}
            versions = {str(k): int(v) for k, v in data["versions"].items()}
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CheckpointError(f"sweep progress file is unreadable: {exc}; delete it and the next run sweeps "
                                  "the sources again (nothing is recorded twice)", flow=flow, path=path) from exc
        self._sweeps[flow] = (spec_hash, versions, found[1])
        return dict(versions)

    def save_sweep(self, flow: str, spec_hash: str, versions: dict[str, int]) -> None:
        self._sweeps.pop(flow, None)
        tag = storage.write(self._sweep_path(flow), self._sweep_bytes(spec_hash, versions))
        self._sweeps[flow] = (spec_hash, dict(versions), tag)

    def advance_sweep(self, flow: str, spec_hash: str, versions: dict[str, int]) -> bool:
        """Replace the sweep progress this store last read or wrote with `versions`, only if the object is
        still the one it read or wrote (one conditional write, no lease): a sweep whose new commits hold no row
        to record advances so. False, and nothing written, when this store knows no progress object of
        `spec_hash` or another sweeper replaced it since: then the caller sweeps under the lease."""
        known = self._sweeps.get(flow)
        if known is None or known[0] != spec_hash or known[2] is None:
            return False
        tag = storage.replace_tagged(self._sweep_path(flow), self._sweep_bytes(spec_hash, versions), known[2])
        if tag is None:
            self._sweeps.pop(flow, None)
            return False
        self._sweeps[flow] = (spec_hash, dict(versions), tag)
        return True

    @staticmethod
    def _sweep_bytes(spec_hash: str, versions: dict[str, int]) -> bytes:
        return json.dumps({"spec_hash": spec_hash, "versions": versions}, sort_keys=True).encode()

    def swept(self, flow: str, spec_hash: str) -> dict[str, int] | None:
        """The sweep progress this store last read or wrote for `flow` under `spec_hash` (None: unknown)."""
        known = self._sweeps.get(flow)
        return dict(known[1]) if known is not None and known[0] == spec_hash else None

    def partitions(self, flow: str) -> list[str]:
        """Partition keys with a watermark for `flow`."""
        out = []
        for uri, _size in storage.list_files(storage.join(self.base, "checkpoints", flow)):
            if uri.endswith(".json"):
                data = storage.read(uri)
                if data is not None:
                    out.append(json.loads(data)["partition"])
        return sorted(out)

    @contextmanager
    def lease(self, flow: str, partition: str, run_id: str) -> Iterator[None]:
        """Hold the exclusive lease of one (flow, partition) for the duration of a run."""
        path = self._lock_path(flow, partition)
        try:
            tag = self._acquire(path, flow, partition, run_id)
        except OSError as exc:  # a folder this process may not write (permissions, a file in its place, a full disk)
            folder = path.rsplit("/", 1)[0]
            raise StorageError(
                f"cannot take the lease of {flow} {partition}: writing under {folder} failed "
                f"({exc.strerror or exc}); make that folder writable by this process, then run again",
                flow=flow, partition=partition, path=path) from exc
        # only our own lease: the delete is conditional on the tag this run wrote, so a lease another
        # run took over stays (one request, no read first)
        try:
            yield
        except BaseException:
            # the run's own error is what the caller reports: a release that fails too (the store that
            # failed the run does not answer) leaves a lease this process knows to be stale (`_stale`)
            try:
                storage.delete(path, tag=tag)
            except (StorageError, OSError) as exc:
                with _abandoned_lock:
                    _abandoned.add((path, run_id))
                log.warning("%s %s: the lease %s was not released (%s); this process's next run of it takes "
                            "it over", flow, partition, path, exc)
            raise
        storage.delete(path, tag=tag)

    def _acquire(self, path: str, flow: str, partition: str, run_id: str) -> str:
        """Take the lease; returns the tag of the lease object this run wrote (from the write's own
        answer: one request when the lease is free)."""
        body = json.dumps({"run_id": run_id, "pid": os.getpid(), "process_started": process_started(os.getpid()),
                           "host": socket.gethostname(), "started": time.time()}).encode()
        tag = storage.create_tagged(path, body)
        if tag is not None:
            return tag
        current = storage.read_tagged(path)
        if current is not None and (self._stale(current[0]) or _abandoned_here(current[0], path)):
            tag = storage.replace_tagged(path, body, current[1])  # of several runs finding it stale, one wins
            if tag is not None:
                return tag
        elif current is None:  # released meanwhile
            tag = storage.create_tagged(path, body)
            if tag is not None:
                return tag
        holder = self._holder(storage.read(path))
        raise ConcurrentRunError(
            f"partition is being processed by another run ({holder}); wait for it to finish, "
            f"or delete {path} if that run is dead",
            flow=flow, partition=partition,
        )

    @staticmethod
    def _holder(data: bytes | None) -> str:
        try:
            info = json.loads(data or b"")
            return f"run {info.get('run_id')} pid {info.get('pid')} on {info.get('host')}"
        except ValueError:
            return "unknown holder"

    def _stale(self, data: bytes) -> bool:
        """A lease older than `lease_seconds`, or whose holder on this host is gone (see the module's
        docstring). A run holding its lease longer than that can lose it; it cannot commit twice with
        the run that took it over (the app-transaction check), it fails and its partition refills."""
        try:
            info = json.loads(data)
        except ValueError:
            return True  # a half-written lease of a local writer that died: nobody holds it
        return self._stale_info(info)

    def _stale_info(self, info) -> bool:
        try:
            age = time.time() - float(info.get("started") or 0)
        except (ValueError, TypeError, AttributeError):
            return True
        if age > self.lease_seconds:
            return True
        if info.get("host") != socket.gethostname():
            return False  # another machine's process: only its age tells
        try:
            pid = int(info["pid"])
        except (KeyError, TypeError, ValueError):
            return False  # no pid to look for: it expires by age
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # a process of another user has the pid: the start time tells
            pass
        except (OverflowError, ValueError):
            return True  # no process can have that pid
        held_by = info.get("process_started")
        now = process_started(pid)
        return held_by is not None and now is not None and held_by != now


def process_started(pid: int) -> str | None:
    """When process `pid` started, as '<boot id>:<clock ticks since boot>' (Linux /proc); None where
    unknown. With the pid it names one process: a pid reused later has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            boot = fh.read().decode().strip()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None  # field 22 of stat(5): starttime
