"""A Redis delivery stopped at each of its steps (before the write, after the keys and before the version, after
both, after the lake's record would have been written) leaves every key whole (one script per batch) and the
delivered version old or new; the next delivery converges: each key holds the latest row of the Delta table, no
stale key is left, and later changes apply. A delivery stopped after writing keys leaves a mark whose lease keeps
others out while it may still run, and makes the next delivery a full resync (its keys may be ahead of the
delivered version). An injected crash at every step, and a real SIGKILL of a child process. No Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from laminar_assets.engine import ConcurrentDeliveryError
from laminar_assets.engine.export import EXPORT_STEPS, load_record
from laminar_assets.engine.export.redis import RedisTarget
from laminar_assets.errors import InjectedCrash
from tests.engine.export.helpers import Sink, change_history, crash_at, flow_rows
from tests.engine.export.redis_helpers import assert_equal, cache, client, deliver, state


def _converges(root: str, url: str, sink: Sink) -> None:
    """The next delivery brings the cache to the table, and later changes apply."""
    deliver(root, url)
    assert_equal(url, sink)
    assert load_record(root, "m1_cache").delivered_version == sink.version()
    sink.replace_hour(1, flow_rows([(1, 0, "d", 1, 1.0), (1, 0, "b", 7, 1.0)]))
    assert deliver(root, url).rows_upserted == 2
    assert_equal(url, sink)


@pytest.mark.parametrize("first", [True, False], ids=["first-delivery", "incremental"])
@pytest.mark.parametrize("step", EXPORT_STEPS)
def test_a_crash_at_each_step_then_a_rerun_converges(tmp_path, redis_url, monkeypatch, step, first):
    monkeypatch.setattr(RedisTarget, "lease_seconds", 0)  # a killed delivery's lease is over at once
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    if not first:
        deliver(root, redis_url)
        change_history(sink)
    before = cache(redis_url)
    with pytest.raises(InjectedCrash):
        deliver(root, redis_url, hook=crash_at(step))
    held = state(redis_url)
    if step in ("export_after_version", "export_after_commit"):  # delivered, whole
        assert_equal(redis_url, sink)
    elif step == "export_before_write":  # nothing touched
        assert cache(redis_url) == before and "pending" not in held
    else:  # the keys written, the version not: the mark says so
        assert held["pending_version"] == str(sink.version()) and held.get("version") == (None if first else "0")
    result = deliver(root, redis_url)
    expected = {"export_before_write": "FULL" if first else "INCREMENTAL", "export_after_rows": "FULL"}
    assert result.mode.value == expected.get(step, "NOOP"), result.detail
    if step == "export_after_rows" and not first:
        assert result.reason.value == "TARGET_CHANGED" and "did not finish" in result.detail
    _converges(root, redis_url, sink)


def test_keys_ahead_of_the_delivered_version_are_resynced_even_when_the_table_changed_back(tmp_path, redis_url,
                                                                                          monkeypatch):
    """A delivery stopped after writing a's new row; then the table's a changes back. The change feed since the
    delivered version nets a out (same before and after), so only a full resync puts a's row back."""
    monkeypatch.setattr(RedisTarget, "lease_seconds", 0)
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 0, "b", 1, 1.0)]))
    deliver(root, redis_url)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 1.0), (0, 0, "b", 1, 1.0)]))
    with pytest.raises(InjectedCrash):
        deliver(root, redis_url, hook=crash_at("export_after_rows"))
    assert cache(redis_url)["pos:a"]["n"] == 2  # ahead of the delivered version 0
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 0, "b", 1, 1.0)]))
    result = deliver(root, redis_url)
    assert (result.mode.value, result.reason.value) == ("FULL", "TARGET_CHANGED")
    assert_equal(redis_url, sink)


def test_a_delivery_that_may_still_be_writing_keeps_others_out_until_its_lease_ends(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    deliver(root, redis_url)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 1.0), (0, 1, "b", 1, 1.0)]))
    with pytest.raises(InjectedCrash):  # stopped after its keys, without a word: it may be alive and writing
        deliver(root, redis_url, hook=crash_at("export_after_rows"))
    written = cache(redis_url)
    with pytest.raises(ConcurrentDeliveryError) as info:
        deliver(root, redis_url)
    assert info.value.retryable and "another delivery (to version 1) is writing its keys" in str(info.value)
    assert cache(redis_url) == written and state(redis_url)["version"] == "0"
    with client(redis_url) as c:  # its lease runs out (as 60 s would)
        c.hset("laminar:exports:m1_cache", "lease_until", "0")
    assert deliver(root, redis_url).reason.value == "TARGET_CHANGED"
    assert_equal(redis_url, sink)


def test_a_delivery_that_fails_cleanly_lets_the_next_one_take_over_at_once(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    deliver(root, redis_url)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 1.0), (0, 1, "b", 1, 1.0)]))

    def fails(step: str) -> None:
        if step == "export_after_rows":
            raise ConnectionResetError("the network went away")

    with pytest.raises(ConnectionResetError):
        deliver(root, redis_url, hook=fails)
    assert state(redis_url)["lease_until"] == "0"
    assert deliver(root, redis_url).reason.value == "TARGET_CHANGED"
    assert_equal(redis_url, sink)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from laminar_assets.engine import Connection, Exporter
    from laminar_assets.engine.export.redis import RedisTarget
    from tests.engine.export.redis_helpers import REDIS_EXPORT
    from tests.engine.export.helpers import FLOW
    RedisTarget.lease_seconds = 0  # the test's rerun takes over without waiting for a lease
    def hook(step):
        if step == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)
    Exporter(sys.argv[1], connections={"cache": Connection("cache", sys.argv[2])}, hook=hook).deliver(REDIS_EXPORT, FLOW)
""")


@pytest.mark.parametrize("step", ["export_before_write", "export_after_rows", "export_after_version"])
def test_sigkill_at_each_step_then_a_rerun_converges(tmp_path, redis_url, step):
    """Killed before writing (nothing changed), between its keys and its version (the rerun takes over, the killed
    one's lease being 0, and resyncs every key), or after both (the rerun finds the version delivered)."""
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    deliver(root, redis_url)
    before = cache(redis_url)
    change_history(sink)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, root, redis_url, step], cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr[-2000:]
    held = state(redis_url)
    if step == "export_before_write":
        assert cache(redis_url) == before and held["version"] == "0" and "pending" not in held
    elif step == "export_after_rows":
        assert (held["version"], held["pending_version"]) == ("0", str(sink.version()))
    else:
        assert_equal(redis_url, sink)
        assert load_record(root, "m1_cache").delivered_version == 0  # the lake's record is one delivery behind
    result = deliver(root, redis_url)
    assert (result.mode.value, result.reason.value) == {
        "export_before_write": ("INCREMENTAL", "NEW_VERSIONS"), "export_after_rows": ("FULL", "TARGET_CHANGED"),
        "export_after_version": ("NOOP", "UP_TO_DATE")}[step], result.detail
    _converges(root, redis_url, sink)
