"""The checkpoint store: atomic watermark files and exclusive partition leases."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from laminar_assets.checkpoints import CheckpointStore, PendingRun, Watermark
from laminar_assets.checkpoints.store import process_started
from laminar_assets.engine import CheckpointError, ConcurrentRunError


def test_round_trip_with_pending(tmp_path):
    store = CheckpointStore(str(tmp_path))
    mark = Watermark("f", "2024-01-01-00:00", "abc", {"src": 3}, 2,
                     pending=PendingRun(3, "run", {"src": 5}, "INCREMENTAL", "APPEND_ONLY"))
    store.save(mark)
    loaded = store.load("f", "2024-01-01-00:00")
    assert loaded.with_(updated_at=None) == mark
    assert store.partitions("f") == ["2024-01-01-00:00"]
    assert os.listdir(tmp_path / "_laminar" / "watermarks" / "f") == ["2024-W01.json"]  # no temporary file left


def test_missing_and_corrupt(tmp_path):
    store = CheckpointStore(str(tmp_path))
    assert store.load("f", "2024-01-01") is None
    path = tmp_path / "_laminar" / "watermarks" / "f"
    path.mkdir(parents=True)
    (path / "2024-01.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="delete it to force a refill of the partitions it names") as err:
        store.load("f", "2024-01-01")
    assert str(path / "2024-01.json") in str(err.value)


def test_lease_is_exclusive_and_released(tmp_path):
    store = CheckpointStore(str(tmp_path))
    with store.lease("f", "p", "run-1"):
        with pytest.raises(ConcurrentRunError, match="run run-1"):
            with store.lease("f", "p", "run-2"):
                pass
        with store.lease("f", "other", "run-3"):
            pass
    with store.lease("f", "p", "run-4"):
        pass


def _write_lease(tmp_path, **info) -> None:
    """A lease file as another run left it (`store.lease` writes the same fields)."""
    folder = tmp_path / "_laminar" / "locks" / "f"
    folder.mkdir(parents=True, exist_ok=True)
    body = {"run_id": "old-run", "host": socket.gethostname(), "started": time.time(), **info}
    (folder / "p.lock").write_text(json.dumps({k: v for k, v in body.items() if v is not None}))


def test_a_lease_whose_pid_was_reused_is_taken_over(tmp_path):
    """The pid is alive (this very process) but started at another time than the lease's holder: the
    pid was reused, as after a container restart. On main the lease never expired on this host."""
    if process_started(os.getpid()) is None:
        pytest.skip("process start times are read from Linux /proc")
    boot, ticks = process_started(os.getpid()).split(":")
    for holder in (f"{boot}:{int(ticks) - 1}", f"another-boot:{ticks}"):  # a tick earlier; before a reboot
        _write_lease(tmp_path, pid=os.getpid(), process_started=holder)
        with CheckpointStore(str(tmp_path)).lease("f", "p", "run-2"):
            pass


def test_a_lease_without_a_pid_expires_by_age(tmp_path):
    store = CheckpointStore(str(tmp_path), lease_seconds=60)
    _write_lease(tmp_path, started=time.time())
    with pytest.raises(ConcurrentRunError, match="old-run"):
        with store.lease("f", "p", "run-2"):
            pass
    _write_lease(tmp_path, started=time.time() - 61)
    with store.lease("f", "p", "run-3"):
        pass


def test_a_live_holder_keeps_its_lease_until_lease_seconds_on_this_host_too(tmp_path):
    store = CheckpointStore(str(tmp_path), lease_seconds=60)
    mine = dict(pid=os.getpid(), process_started=process_started(os.getpid()))
    _write_lease(tmp_path, **mine, started=time.time() - 30)
    with pytest.raises(ConcurrentRunError, match="old-run"):
        with store.lease("f", "p", "run-2"):
            pass
    _write_lease(tmp_path, **mine, started=time.time() - 61)  # still alive, but past lease_seconds
    with store.lease("f", "p", "run-3"):
        pass


def test_a_lease_the_store_refuses_to_write_is_one_error_naming_the_partition_and_folder(tmp_path):
    """A lock folder the process may not write (here a file stands where the folder goes; a permission
    denied is the same OSError): one StorageError with the flow, the partition and what to fix, not a
    bare `PermissionError: [Errno 1] ...` naming a temporary file."""
    from laminar_assets.errors import StorageError

    store = CheckpointStore(str(tmp_path))
    locks = tmp_path / "_laminar" / "locks"
    locks.mkdir(parents=True)
    (locks / "f").write_text("not a folder")
    with pytest.raises(StorageError) as caught:
        with store.lease("f", "2024-01-01-00:00", "run-1"):
            pass
    err = caught.value
    assert err.facts["flow"] == "f" and err.facts["partition"] == "2024-01-01-00:00"
    assert "cannot take the lease" in err.message and str(locks / "f") in err.message, err.message


def test_sweep_progress_advances_without_a_lease_only_from_the_version_this_store_knows(tmp_path):
    """`advance_sweep` replaces the progress only while it is the object this store last read or wrote (one
    conditional write); another sweeper's write in between, another spec hash or no progress yet: nothing is
    written, and the caller sweeps under the lease."""
    store, other = CheckpointStore(str(tmp_path)), CheckpointStore(str(tmp_path))
    assert not store.advance_sweep("f", "h1", {"src": 3})  # no progress known
    assert store.load_sweep("f", "h1") == {}
    assert not store.advance_sweep("f", "h1", {"src": 3})  # none written yet: the lease path writes the first
    store.save_sweep("f", "h1", {"src": 2})
    assert store.advance_sweep("f", "h1", {"src": 3}) and store.swept("f", "h1") == {"src": 3}
    assert other.load_sweep("f", "h1") == {"src": 3}
    assert store.advance_sweep("f", "h1", {"src": 4})  # its own write's tag: again
    other.save_sweep("f", "h1", {"src": 9})  # another sweeper moved it
    assert not store.advance_sweep("f", "h1", {"src": 5})
    assert store.swept("f", "h1") is None and other.load_sweep("f", "h1") == {"src": 9}  # not overwritten
    assert store.load_sweep("f", "h1") == {"src": 9} and not store.advance_sweep("f", "h2", {"src": 10})
    assert other.load_sweep("f", "h1") == {"src": 9}


def test_a_watermark_is_written_only_over_the_version_its_writer_read(tmp_path):
    """`write_if`, what a run's writes of its watermarks are: the first one only where there is none (or over
    the version read), each later one over the version it last wrote; a writer that lost the race writes
    nothing and learns it."""
    store, other = CheckpointStore(str(tmp_path)), CheckpointStore(str(tmp_path))
    mark = Watermark("f", "p", "abc", {"src": 1}, 1)
    first = store.write_if(mark, None)
    assert first is not None and store.write_if(mark, None) is None  # there is one now
    read, tag = other.load_tagged("f", "p")
    assert tag == first and read.with_(updated_at=None) == mark
    second = other.write_if(mark.with_(seq=2), tag)
    assert second is not None and second != first
    assert store.write_if(mark.with_(seq=3), first) is None  # `other` wrote since
    assert store.load("f", "p").seq == 2
    assert store.load_listed_tagged("f", ["p", "q"]) == {"p": (store.load("f", "p"), second), "q": (None, None)}


def test_a_holder_is_gone_when_its_process_is_its_age_is_past_or_this_process_ended_its_run(tmp_path):
    import subprocess

    from laminar_assets.checkpoints import Holder

    store = CheckpointStore(str(tmp_path), lease_seconds=60)
    me = store.holder("run-1")
    assert me.pid == os.getpid() and not store.holder_gone(me, "f", "p")
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert store.holder_gone(Holder("run-0", socket.gethostname(), time.time(), gone.pid, "0:0"), "f", "p")
    assert store.holder_gone(Holder("run-0", "elsewhere", time.time() - 61, 1), "f", "p")  # by its age, any host
    assert not store.holder_gone(Holder("run-0", "elsewhere", time.time(), 1), "f", "p")
    store.abandon("f", "p", "run-1")  # the run ended here still named as holder: taken over here
    assert store.holder_gone(me, "f", "p") and not store.holder_gone(me, "f", "q")
    mark = Watermark("f", "p", "abc", {"src": 1}, 1, holder=me)
    store.save(mark)
    assert store.load("f", "p").holder == me  # a holder survives the round trip


def test_the_watermarks_of_a_week_are_one_object_written_once_per_step(tmp_path, monkeypatch):
    """A run's intents (or its watermarks) over six hours of one week: one conditional write of one object."""
    from laminar_assets import storage

    store = CheckpointStore(str(tmp_path))
    keys = [f"2024-01-01-0{h}:00" for h in range(6)] + ["2024-01-07-23:00", "2024-01-08-00:00"]  # Mon; Sun; Mon
    writes = []
    for name in ("create_tagged", "replace_tagged"):
        real = getattr(storage, name)
        monkeypatch.setattr(storage, name, lambda *a, _real=real, _name=name: writes.append((_name, a[0])) or _real(*a))
    tags = store.write_many_if([(Watermark("f", k, "abc", {"src": 1}, 1), None) for k in keys])
    assert all(tags) and len(set(tags)) == len(keys)
    assert sorted(w[1].rsplit("/", 1)[1] for w in writes) == ["2024-W01.json", "2024-W02.json"]
    writes.clear()
    again = store.write_many_if([(Watermark("f", k, "abc", {"src": 2}, 2), t) for k, t in zip(keys[:6], tags)])
    assert all(again) and [w[0] for w in writes] == ["replace_tagged"]
    assert sorted(os.listdir(tmp_path / "_laminar" / "watermarks" / "f")) == ["2024-W01.json", "2024-W02.json"]
    assert store.partitions("f") == sorted(keys)


def test_writers_of_one_block_compare_entries_not_the_block(tmp_path):
    """Two stores (two runs) writing different hours of one week both land, whoever wrote the object last; of two
    writers of one hour, the one holding a revision older than the entry's writes nothing, and the others of its
    batch are written all the same."""
    a, b = CheckpointStore(str(tmp_path)), CheckpointStore(str(tmp_path))
    m = Watermark("f", "2024-01-01-00:00", "abc", {"src": 1}, 1)
    n = m.with_(partition="2024-01-01-01:00")
    ta = a.write_if(m, None)
    tb = b.write_if(n, None)  # b's view of the block was empty: its create loses, it reads the block, compares again
    assert ta and tb
    ta2 = a.write_if(m.with_(seq=2), ta)  # a's view of the block is older than b's write: it retries on the new one
    assert ta2 and b.load("f", m.partition).seq == 2 and a.load("f", n.partition).seq == 1
    # b still holds the revision of 00:00 it never read: refused; 01:00 in the same batch is written
    lost, won = b.write_many_if([(m.with_(seq=9), ta), (n.with_(seq=2), tb)])
    assert lost is None and won
    assert a.load("f", m.partition).seq == 2 and a.load("f", n.partition).seq == 2
    assert b.delete_if("f", m.partition, ta) is False and b.delete_if("f", n.partition, won) is True
    assert a.partitions("f") == [m.partition]


def test_watermarks_of_the_layout_before_blocks_are_read_then_folded_into_their_block(tmp_path):
    """A lake written before blocks keeps its progress: one file per partition is read while its block has no
    object, and the block's first write carries every one of them."""
    old = tmp_path / "_laminar" / "checkpoints" / "f"
    old.mkdir(parents=True)
    for key in ("2024-01-01-00:00", "2024-01-01-01:00", "2024-01-02-00:00"):
        mark = Watermark("f", key, "abc", {"src": 4}, 3)
        (old / f"{key.replace(':', '-')}.json").write_text(json.dumps(mark.to_json()))
    store = CheckpointStore(str(tmp_path))
    assert store.partitions("f") == ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-02-00:00"]
    mark, tag = store.load_tagged("f", "2024-01-01-01:00")
    assert mark.seq == 3 and tag is not None
    assert store.write_if(mark.with_(seq=4), tag)
    later = CheckpointStore(str(tmp_path))
    assert later.load("f", "2024-01-01-01:00").seq == 4 and later.load("f", "2024-01-01-00:00").seq == 3
    assert os.listdir(tmp_path / "_laminar" / "watermarks" / "f") == ["2024-W01.json"]
    assert later.partitions("f") == ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-02-00:00"]
    later.forget("f", "2024-01-01-00:00")
    assert CheckpointStore(str(tmp_path)).load("f", "2024-01-01-00:00") is None  # the old file no longer counts


def _own_hour(root: str, hour: int, writes: int, results) -> None:
    """A process writing only its own hour of one week, read and conditional write in turn."""
    store, key, done = CheckpointStore(root), f"2024-01-01-{hour:02d}:00", 0
    for _ in range(writes):
        mark, tag = store.load_tagged("f", key)
        new = (mark or Watermark("f", key, "abc", {}, 0)).with_(seq=(mark.seq if mark else 0) + 1)
        done += store.write_if(new, tag) is not None
    results.put((hour, done))


def test_processes_writing_other_hours_of_one_week_lose_no_write_on_a_local_disk(tmp_path):
    """A block on a local disk is checked and replaced in one step for every process of the machine (the folder's
    lock), as an object store's conditional PUT: no process's write is overwritten by another's older view."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_own_hour, args=(str(tmp_path), h, 40, results)) for h in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    done = dict(results.get(timeout=5) for _ in procs)
    store = CheckpointStore(str(tmp_path))
    assert {h: store.load("f", f"2024-01-01-{h:02d}:00").seq for h in range(4)} == done == {h: 40 for h in range(4)}


def test_a_write_over_two_weeks_that_fails_on_one_keeps_what_landed_on_the_other(tmp_path, monkeypatch):
    """Every block of a step is tried; the run learns which of its writes landed (it holds those partitions, and
    clears them when it ends) before the failed block's error reaches it."""
    from laminar_assets import storage
    from laminar_assets.engine.run.protocol import Claims
    from laminar_assets.engine.spec.specs import Agg, FlowSpec, Tumbling

    spec = FlowSpec(name="f", source="s", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),))
    store = CheckpointStore(str(tmp_path))
    real = storage.create_tagged

    def second_week_fails(uri, data):
        if uri.endswith("2024-W02.json"):
            raise OSError("disk full")
        return real(uri, data)

    monkeypatch.setattr(storage, "create_tagged", second_week_fails)
    claims = Claims(store, spec, "run-1", {})
    with pytest.raises(OSError, match="disk full"):
        claims.claim_all({"2024-01-07-23:00": None, "2024-01-08-00:00": None})  # a Sunday, then a Monday
    assert list(claims.held) == ["2024-01-07-23:00"]
    assert store.load("f", "2024-01-07-23:00").holder.run_id == "run-1"
    claims.end(OSError("disk full"))  # the run ends: what it holds is given back
    assert store.load("f", "2024-01-07-23:00").holder is None


def test_a_view_left_older_by_a_slow_read_does_not_refuse_a_write(tmp_path):
    """A store whose view of a block is older than what it wrote (a slower read of the same block landed after)
    reads the block again before refusing a write."""
    store = CheckpointStore(str(tmp_path))
    mark = Watermark("f", "2024-01-01-00:00", "abc", {}, 1)
    first = store.write_if(mark, None)
    before = store._blocks[store.block_path("f", mark.partition)]  # the view after the first write
    second = store.write_if(mark.with_(seq=2), first)
    store._blocks[store.block_path("f", mark.partition)] = before  # as if a read of the older block landed last
    assert store.write_if(mark.with_(seq=3), second) is not None
    assert CheckpointStore(str(tmp_path)).load("f", mark.partition).seq == 3


def test_a_lake_before_blocks_is_read_once_and_its_files_go_once_folded(tmp_path, monkeypatch):
    """The per-partition files of a lake written before blocks are read once per store (however often reports ask),
    their partitions named by the files' own keys; once a block carries them they are deleted, so deleting the
    block (its file unreadable) refills its partitions instead of bringing the old watermarks back."""
    from laminar_assets import storage

    old = tmp_path / "_laminar" / "checkpoints" / "f"
    old.mkdir(parents=True)
    keys = ["2024-01-01-00:00", "2024-01-01-01:00", "eu/west"]
    for key in keys:
        mark = Watermark("f", key, "abc", {}, 3)
        (old / f"{key.replace(':', '-').replace('/', '_')}.json").write_text(json.dumps(mark.to_json()))
    reads = []
    real = storage.read_many_tagged
    monkeypatch.setattr(storage, "read_many_tagged", lambda uris: reads.extend(uris) or real(uris))
    store = CheckpointStore(str(tmp_path))
    assert store.partitions("f") == sorted(keys)
    for _ in range(3):
        assert [store.load("f", k).seq for k in keys] == [3, 3, 3]
    assert sorted(u.rsplit("/", 1)[1] for u in reads if "/checkpoints/" in u) == [
        "2024-01-01-00-00.json", "2024-01-01-01-00.json", "eu_west.json"]
    mark, tag = store.load_tagged("f", keys[0])
    assert store.write_if(mark.with_(seq=4), tag)
    assert sorted(os.listdir(old)) == ["eu_west.json"]  # the week's files are in its block now
    os.remove(tmp_path / "_laminar" / "watermarks" / "f" / "2024-W01.json")
    assert CheckpointStore(str(tmp_path)).load("f", keys[1]) is None
