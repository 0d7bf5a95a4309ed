"""The tests' own lake checks (tests/lake_invariants.py) catch what they exist for, with a listing of the
lake made once (`LakeView`, as the stateful test checks each step) and without one: a table naming a file
that is gone, an uncommitted file no commit took, a commit the next listing must see. Local and in a bucket."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_assets import storage
from tests.lake_invariants import LakeView, assert_lake_intact, assert_no_orphans, latest_frame, writers

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.process)])  # s3: a moto server
def root(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "lake")
        return
    from tests.object_store import using

    server = request.getfixturevalue("s3_server")
    with using(server):
        yield server.bucket()


def _write(uri: str, mode: str = "append") -> None:
    write_deltalake(uri, ROWS, mode=mode, storage_options=storage.delta_options(uri))


@pytest.mark.parametrize("with_view", [True, False], ids=["view", "listing"])
def test_the_checks_catch_a_missing_file_an_uncommitted_file_and_see_each_commit(root, with_view):
    def view():
        return LakeView(root) if with_view else None

    sink = storage.join(root, "sums")
    state = storage.join(root, "_laminar", "state", "sums", "v1")
    for uri in (sink, state):
        _write(uri)
    assert_lake_intact(root, view())
    assert_no_orphans(root, ["sums"], view())
    assert len(latest_frame(sink, view())) == 2 and writers(sink, view()) == {None}

    _write(sink)  # a new commit: the snapshot kept for the table is replaced
    assert len(latest_frame(sink, view())) == 4

    uncommitted = storage.join(state, "laminar", "run-1-abc", "part-0.parquet")
    storage.write(uncommitted, b"PAR1")
    with pytest.raises(AssertionError, match="run-1-abc"):
        assert_no_orphans(root, ["sums"], view())
    storage.delete_tree(storage.join(state, "laminar"))  # locally its empty folders would be found too
    assert_no_orphans(root, ["sums"], view())

    named = [u for u, _ in storage.list_files(sink) if u.endswith(".parquet")][0]
    storage.delete(named)
    with pytest.raises(AssertionError, match="missing files"):
        assert_lake_intact(root, view())
