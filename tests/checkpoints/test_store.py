"""The checkpoint store: atomic watermark files and exclusive partition leases."""

from __future__ import annotations

import os

import pytest

from laminar_assets.checkpoints import CheckpointStore, PendingRun, Watermark
from laminar_assets.engine import CheckpointError, ConcurrentRunError


def test_round_trip_with_pending(tmp_path):
    store = CheckpointStore(str(tmp_path))
    mark = Watermark("f", "2024-01-01-00:00", "abc", {"src": 3}, 2,
                     pending=PendingRun(3, "run", {"src": 5}, "INCREMENTAL", "APPEND_ONLY"))
    store.save(mark)
    loaded = store.load("f", "2024-01-01-00:00")
    assert loaded.with_(updated_at=None) == mark
    assert store.partitions("f") == ["2024-01-01-00:00"]
    assert not [n for n in os.listdir(tmp_path / "_laminar" / "checkpoints" / "f") if n.endswith(".tmp")]


def test_missing_and_corrupt(tmp_path):
    store = CheckpointStore(str(tmp_path))
    assert store.load("f", "2024-01-01") is None
    path = tmp_path / "_laminar" / "checkpoints" / "f"
    path.mkdir(parents=True)
    (path / "2024-01-01.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="delete it to force a refill"):
        store.load("f", "2024-01-01")


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
