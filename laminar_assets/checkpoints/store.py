"""Durable storage of watermarks and leases, beside the tables (a folder or a bucket).

Layout under the storage root:
    _laminar/watermarks/<flow>/<block>.json        the watermarks of a block of partitions (a week of hourly
                                                   ones, a month of daily ones: `block_of`), each naming the
                                                   run that holds its partition while one does (`Watermark.holder`)
    _laminar/locks/<flow>/_sweep.lock              lease of the run sweeping the flow's partition-less rows
    _laminar/sweeps/<flow>.json                    source versions the quarantine sweep has read
    _laminar/checkpoints/<flow>/<partition>.json   a watermark as stores before blocks wrote it: read (and
                                                   folded into its block) while its block has no object yet

No step relies on an atomic rename, which an object store does not have (laminar_assets.storage):
- a block is one object, replaced by a single write (a rename on a local disk, one PUT on S3), only
  conditionally on the version this store read or last wrote (`If-Match`, or `If-None-Match: *` where there
  is none). Each watermark in it carries a revision, new at each write of it; a run writes a watermark only
  if its entry still holds the revision the run read or last wrote (`write_if`), and when the block's write
  loses to another writer's, the block is read again and each entry compared again (so runs of different
  partitions of one block both land, one after the other, and of two runs of one partition one does). A
  run's writes of one step (its intents, its watermarks) are one write per block (`write_many_if`). A run
  names itself as holder until its last write: the watermark is the partition's lease, and the run's first
  write of it (its intent) is the claim. A holder is gone by the lease rules below (`holder_gone`);
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

import contextvars
import json
import logging
import os
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime

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


_HOURLY_KEY = re.compile(r"\d{4}-\d{2}-\d{2}-\d{2}:\d{2}")
_DAILY_KEY = re.compile(r"\d{4}-\d{2}-\d{2}")

BLOCK_ATTEMPTS = 16
"""At most this many conditional writes of one block for one change: each lost one means another writer changed
the block in between (a run of other partitions of the same day); past this, `ConcurrentRunError`."""

ANY = object()
"""As the expected revision of a change: whatever the partition's entry is (an unconditional `save`)."""


def block_of(partition: str) -> str:
    """The block whose object holds `partition`'s watermark: the ISO week of an hourly key ('2024-01-31-13:00' ->
    '2024-W05', Monday to Sunday, 168 entries), the month of a daily one ('2024-01-31' -> '2024-01'); a key of
    another form is its own block. A batched run covers adjacent partitions, so its watermarks are one object,
    written once per step: late rows of the last few days too (a block of a day made such a run write up to a
    week's seven objects twice; docs/PERFORMANCE.md, "The watermarks of a week in one object")."""
    if _HOURLY_KEY.fullmatch(partition):
        year, week, _day = date.fromisoformat(partition[:10]).isocalendar()
        return f"{year}-W{week:02d}"
    if _DAILY_KEY.fullmatch(partition):
        return partition[:7]
    return partition


@dataclass(frozen=True)
class _Block:
    """A block object as last read or written: its tag (None: there is no object yet) and its entries,
    partition -> (revision, watermark). A revision names one write of one entry (a new random one each time),
    so a conditional write of a partition compares its entry, not the whole block."""

    tag: str | None
    entries: dict[str, tuple[str, Watermark]]


class CheckpointStore:
    """Reads and writes watermarks and leases under `<root>/_laminar`."""

    def __init__(self, root: str, *, lease_seconds: float = 6 * 3600) -> None:
        self.root = root
        self.base = storage.join(root, "_laminar")
        self.lease_seconds = lease_seconds
        # block object -> the block as this store last read or wrote it: the base of its next write (a write
        # conditional on its tag), and served by `load_listed` while a listing shows the same tag
        self._blocks: dict[str, _Block] = {}
        self._block_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # flow -> name -> tag of each watermark file of the per-partition layout before blocks (listed once), and
        # block object -> the watermarks of those files its partitions have (read once: nothing writes them)
        self._legacy: dict[str, dict[str, str]] = {}
        self._legacy_blocks: dict[str, dict[str, tuple[str, Watermark]]] = {}
        # flow -> (spec hash, versions, the progress object's tag: None when none was written) last read or written
        self._sweeps: dict[str, tuple[str, dict[str, int], str | None]] = {}

    # --- where things are -------------------------------------------------------------------------
    def block_path(self, flow: str, partition: str) -> str:
        """The object holding `partition`'s watermark (with those of its block's other partitions)."""
        return storage.join(self.base, "watermarks", flow, f"{_safe(block_of(partition))}.json")

    def _legacy_path(self, flow: str, partition: str) -> str:
        return storage.join(self.base, "checkpoints", flow, f"{_safe(partition)}.json")

    def _entry_id(self, flow: str, partition: str) -> str:
        return f"{self.block_path(flow, partition)}#{partition}"

    def _lock_path(self, flow: str, partition: str) -> str:
        return storage.join(self.base, "locks", flow, f"{_safe(partition)}.lock")

    def _sweep_path(self, flow: str) -> str:
        return storage.join(self.base, "sweeps", f"{flow}.json")

    def _block_lock(self, path: str) -> threading.Lock:
        with self._locks_lock:
            return self._block_locks.setdefault(path, threading.Lock())

    # --- reading ----------------------------------------------------------------------------------
    def load(self, flow: str, partition: str) -> Watermark | None:
        return self.load_tagged(flow, partition)[0]

    def load_tagged(self, flow: str, partition: str) -> tuple[Watermark | None, str | None]:
        """The watermark and the revision of its entry as read (None, None: there is none), for `write_if`.
        One read of its block."""
        path = self.block_path(flow, partition)
        block = self._block_read(flow, path, storage.read_tagged(path))
        found = block.entries.get(partition)
        return (found[1], found[0]) if found is not None else (None, None)

    def _block_read(self, flow: str, path: str, found: tuple[bytes, str] | None) -> _Block:
        """The block as `found` (its object's bytes and tag) holds it, kept as this store's view of it. No object:
        the watermarks of its partitions in the layout before blocks (one file each), if any."""
        if found is None:
            block = _Block(None, self._legacy_entries(flow, path))
        else:
            block = _Block(found[1], self._parse(found[0], flow, path))
        self._blocks[path] = block
        return block

    @staticmethod
    def _parse(data: bytes, flow: str, path: str) -> dict[str, tuple[str, Watermark]]:
        try:
            entries = json.loads(data)["entries"]
            return {str(p): (str(e["revision"]), Watermark.from_json(e["watermark"])) for p, e in entries.items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(
                f"watermark file is unreadable (not a block of watermarks as Laminar writes them: "
                f"{type(exc).__name__}: {exc}); delete it to force a refill of the partitions it names (the next run "
                "of each refills it)",
                flow=flow, path=path,
            ) from exc

    def _legacy_entries(self, flow: str, path: str) -> dict[str, tuple[str, Watermark]]:
        """The watermarks, one file per partition as stores before blocks wrote them, of the partitions of block
        `path` (their file's tag as revision): folded into the block when it is first written, and then deleted
        (`_drop_legacy`). The flow's old folder is listed once per store (one request where it is empty), each
        block's files read once; nothing writes them any more."""
        if path in self._legacy_blocks:
            return dict(self._legacy_blocks[path])
        mine = self._legacy_names(flow, path)
        out: dict[str, tuple[str, Watermark]] = {}
        folder = storage.join(self.base, "checkpoints", flow)
        for name, found in zip(mine, storage.read_many_tagged([storage.join(folder, n) for n in mine])):
            if found is None:
                continue
            try:
                mark = Watermark.from_json(json.loads(found[0]))
            except (ValueError, TypeError) as exc:
                raise CheckpointError(
                    f"watermark file is unreadable: {exc}; delete it to force a refill of this partition",
                    flow=flow, path=storage.join(folder, name)) from exc
            out[mark.partition] = (f"file:{found[1]}", mark)
        self._legacy_blocks[path] = out
        return dict(out)

    def _legacy_names(self, flow: str, path: str) -> list[str]:
        """The names of the files of the layout before blocks that hold watermarks of block `path`."""
        if flow not in self._legacy:
            self._legacy[flow] = dict(storage.list_tagged(storage.join(self.base, "checkpoints", flow)))
        block = path.rsplit("/", 1)[1][:-len(".json")]
        return [n for n in self._legacy[flow] if n.endswith(".json") and _safe(block_of(self._legacy_key(n))) == block]

    def _drop_legacy(self, flow: str, path: str) -> None:
        """Delete the files of the layout before blocks that block `path` now carries (its object was just created
        from them): deleting the block later (its file unreadable) then refills its partitions, as deleting a
        watermark file did, instead of bringing the old watermarks back. A file that cannot be deleted stays, and
        is read again only while the block has no object."""
        folder = storage.join(self.base, "checkpoints", flow)
        for name in self._legacy_names(flow, path):
            try:
                storage.delete(storage.join(folder, name))
            except (StorageError, OSError) as exc:
                log.warning("%s: the watermark file %s, now in %s, was not deleted (%s)", flow, name, path, exc)
                continue
            self._legacy[flow].pop(name, None)
        self._legacy_blocks.pop(path, None)

    @staticmethod
    def _legacy_key(name: str) -> str:
        """The partition key a file of the layout before blocks was named after ('2024-01-31-13-00.json')."""
        stem = name[:-len(".json")]
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{2}-\d{2}", stem):
            return f"{stem[:13]}:{stem[14:]}"
        return stem

    def load_listed(self, flow: str, partitions: list[str]) -> dict[str, Watermark | None]:
        """`load` of several partitions, reading each of their blocks once (one request for a run within a
        week of hourly partitions); over several blocks, one listing of them, and a block whose tag is the one
        this store last read or wrote is not read again."""
        return {k: mark for k, (mark, _tag) in self.load_listed_tagged(flow, partitions).items()}

    def load_listed_tagged(self, flow: str, partitions: list[str]) -> dict[str, tuple[Watermark | None, str | None]]:
        """`load_listed`, with the revision of each watermark's entry (None: there is none), for `write_if`."""
        paths = list(dict.fromkeys(self.block_path(flow, p) for p in partitions))
        unread = paths
        if len(paths) > 1 and any(p in self._blocks for p in paths):
            folder = storage.join(self.base, "watermarks", flow)
            names = [p.rsplit("/", 1)[1] for p in paths]
            listed = dict(storage.list_tagged(folder, after=min(names)[:-1], until=max(names)))
            unread = [p for p in paths if p not in self._blocks
                      or self._blocks[p].tag != listed.get(p.rsplit("/", 1)[1])]
        for path, found in zip(unread, storage.read_many_tagged(unread)):
            self._block_read(flow, path, found)
        out: dict[str, tuple[Watermark | None, str | None]] = {}
        for p in partitions:
            entry = self._blocks[self.block_path(flow, p)].entries.get(p)
            out[p] = (entry[1], entry[0]) if entry is not None else (None, None)
        return out

    def partitions(self, flow: str) -> list[str]:
        """Partition keys with a watermark for `flow`."""
        folder = storage.join(self.base, "watermarks", flow)
        names = [n for n, _tag in storage.list_tagged(folder) if n.endswith(".json")]
        paths = [storage.join(folder, n) for n in names]
        out = set()
        for path, found in zip(paths, storage.read_many_tagged(paths)):
            if found is not None:
                out |= set(self._block_read(flow, path, found).entries)
        if flow not in self._legacy:
            self._legacy[flow] = dict(storage.list_tagged(storage.join(self.base, "checkpoints", flow)))
        blocks = {n[:-len(".json")] for n in names}
        legacy_blocks = {_safe(block_of(self._legacy_key(n))) for n in self._legacy[flow] if n.endswith(".json")}
        for block in sorted(legacy_blocks - blocks):  # the partitions each file names (its own key, not its name)
            out |= set(self._legacy_entries(flow, storage.join(folder, f"{block}.json")))
        return sorted(out)

    # --- writing ----------------------------------------------------------------------------------
    def save(self, mark: Watermark) -> None:
        """Replace the watermark atomically (readers see the old one or the new one, never a mix), whatever
        version is there: for tools and tests; a run writes with `write_if`."""
        self._changed(mark.flow, [(mark.partition, ANY, mark)])

    def forget(self, flow: str, partition: str) -> None:
        """Remove the partition's watermark whatever it holds, as deleting its file did before blocks: its
        next run refills it. For tools and tests."""
        self._changed(flow, [(partition, ANY, None)])

    def write_if(self, mark: Watermark, tag: str | None) -> str | None:
        """Write `mark` only if its entry is still the revision `tag` names (None: only if there is no
        watermark yet); the new revision, or None when another writer changed it since (nothing is
        written). Readers see the old watermark or the new one, never a mix."""
        return self.write_many_if([(mark, tag)])[0]

    def write_many_if(self, writes: list[tuple[Watermark, str | None]]) -> list[str | None]:
        """`write_if` of each (watermark, revision) in `writes` (of one flow), one conditional write per
        block: the new revisions, in order; None for each whose entry another writer changed since (the others
        are written all the same). A block whose write fails raises its error once every block was tried
        (`write_many_partly` says which were written)."""
        revisions, error = self.write_many_partly(writes)
        if error is not None:
            raise error
        return revisions

    def write_many_partly(self, writes: list[tuple[Watermark, str | None]]
                          ) -> tuple[list[str | None], BaseException | None]:
        """`write_many_if`, with the first block's error returned beside the revisions of the writes that landed
        (None for the others) instead of raised: a caller holding partitions learns which of its writes took."""
        flows = {m.flow for m, _tag in writes}
        if len(flows) > 1:
            raise ValueError(f"write_many_if writes the watermarks of one flow, not of {sorted(flows)}")
        if not writes:
            return [], None
        return self._change(writes[0][0].flow, [(m.partition, tag, m) for m, tag in writes])

    def delete_if(self, flow: str, partition: str, tag: str | None) -> bool:
        """Remove the watermark only if its entry is still the revision `tag` names (a claim undone; None: there
        is no entry)."""
        return self._changed(flow, [(partition, tag, None)])[0] is not None

    def _changed(self, flow: str, changes: list[tuple[str, object, Watermark | None]]) -> list[str | None]:
        revisions, error = self._change(flow, changes)
        if error is not None:
            raise error
        return revisions

    def _change(self, flow: str, changes: list[tuple[str, object, Watermark | None]]
                ) -> tuple[list[str | None], BaseException | None]:
        """Apply `changes` (partition, expected revision or ANY, new watermark or None to remove it): each
        whose entry holds the expected revision, one conditional write of each block they fall in, side by
        side over several blocks. The new revision of each change applied (a removal: ''), None for the
        others; and the first error of a block's write (every block is tried: a failed one's changes are None)."""
        by_block: dict[str, list[int]] = {}
        for i, (partition, _expected, _mark) in enumerate(changes):
            by_block.setdefault(self.block_path(flow, partition), []).append(i)
        out: list[str | None] = [None] * len(changes)
        calls = [lambda path=path, idx=idx: self._change_block(flow, path, [changes[i] for i in idx])
                 for path, idx in by_block.items()]
        results: list[list[str | None] | BaseException] = []
        if len(calls) > 1 and storage.is_object_store(self.root):
            with ThreadPoolExecutor(min(8, len(calls)), thread_name_prefix="laminar-watermarks") as pool:
                futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
            results = [f.exception() or f.result() for f in futures]  # type: ignore[misc]
        else:
            for call in calls:
                try:
                    results.append(call())
                except Exception as exc:  # noqa: BLE001  (returned to the caller, who raises it)
                    results.append(exc)
        error = next((r for r in results if isinstance(r, BaseException)), None)
        for idx, done in zip(by_block.values(), results):
            if not isinstance(done, BaseException):
                for i, revision in zip(idx, done):
                    out[i] = revision
        return out, error

    def _change_block(self, flow: str, path: str, changes: list[tuple[str, object, Watermark | None]]) -> list[str | None]:
        now = datetime.now(UTC).isoformat()
        with self._block_lock(path):
            block = self._blocks.get(path)
            fresh = block is None  # read now, not this store's earlier view (which a slower read may have left older)
            if block is None:
                block = self._block_read(flow, path, storage.read_tagged(path))
            for attempt in range(BLOCK_ATTEMPTS):
                entries = dict(block.entries)
                out: list[str | None] = []
                for partition, expected, mark in changes:
                    current = entries.get(partition)
                    if expected is not ANY and (current[0] if current else None) != expected:
                        out.append(None)
                        continue
                    if mark is None:
                        entries.pop(partition, None)
                        out.append("")
                    else:
                        revision = uuid.uuid4().hex[:16]
                        entries[partition] = (revision, mark.with_(updated_at=now))
                        out.append(revision)
                if any(r is None for r in out) and not fresh:  # refused on an earlier view: compare on the block as it is
                    block, fresh = self._block_read(flow, path, storage.read_tagged(path)), True
                    continue
                if all(r is None for r in out):
                    return out
                data = self._block_bytes(flow, entries)
                tag = storage.create_tagged(path, data) if block.tag is None else storage.replace_tagged(path, data, block.tag)
                if tag is not None:
                    self._blocks[path] = _Block(tag, entries)
                    if block.tag is None and block.entries:  # created from the files of the layout before blocks
                        self._drop_legacy(flow, path)
                    return out
                # another writer changed the block since: compare each entry again on what it holds now
                if attempt:
                    time.sleep(random.uniform(0.005, 0.05) * attempt)
                block, fresh = self._block_read(flow, path, storage.read_tagged(path)), True
        raise ConcurrentRunError(
            f"the watermarks in {path} changed under each of {BLOCK_ATTEMPTS} writes of this run (other runs of "
            "the same partitions' block write it all the time): this run's writes of that block did not land; run "
            "it again", flow=flow)

    @staticmethod
    def _block_bytes(flow: str, entries: dict[str, tuple[str, Watermark]]) -> bytes:
        return json.dumps({"format": 1, "flow": flow, "entries": {
            p: {"revision": rev, "watermark": mark.to_json()} for p, (rev, mark) in sorted(entries.items())}},
            sort_keys=True).encode()

    def holder(self, run_id: str) -> Holder:
        """`run_id` of this process, as a watermark names the run holding its partition."""
        return Holder(run_id=run_id, host=socket.gethostname(), started=time.time(), pid=os.getpid(),
                      process_started=process_started(os.getpid()))

    def holder_gone(self, holder: Holder, flow: str, partition: str) -> bool:
        """Whether the run a watermark names as its holder holds it no more: by the lease rules (the module's
        docstring), or a run of this process that ended without clearing it (`abandon`)."""
        info = asdict(holder)
        return self._stale_info(info) or _abandoned_here(json.dumps(info).encode(), self._entry_id(flow, partition))

    def abandon(self, flow: str, partition: str, run_id: str) -> None:
        """The run `run_id` of this process ended still named as the partition's holder (a kill simulated in
        tests, a store that stopped answering its last write): this process's runs take the partition over."""
        with _abandoned_lock:
            _abandoned.add((self._entry_id(flow, partition), run_id))

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
