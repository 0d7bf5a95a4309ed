"""A run whose object store stops answering mid-run fails within the store's time bounds with one line
naming the endpoint and the object; nothing of it is visible (no commit of state or sink, the sink
reads as before), and the next run, once the store answers again, catches up and equals a recompute.

The store is a local S3 server of the test's own, frozen with SIGSTOP after the run wrote its intent
(it accepts connections and never answers, as a hung store does) and resumed in a `finally`. On main
such a run hung for 240+ s: s3a retried in two layers, up to 16 attempts of 30 s each."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest

from laminar_assets import storage
from laminar_assets.engine import Agg, Engine, FlowSpec, Tumbling
from laminar_assets.errors import StoreUnavailableError
from laminar_assets.storage.options import S3A_FLOOR_S
from tests.conftest import Lake
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

H0 = "2024-01-01-00:00"
FLOW = FlowSpec(name="per_sym", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))
BASE = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:12:00", "b", 2.0, 2)]
MORE = [("2024-01-01 00:02:00", "a", 4.0, 4), ("2024-01-01 00:31:00", "c", 5.0, 1)]
# short bounds: a Python client's call gives up after 2 s; s3a's after one attempt at Hadoop's 15 s floor
BOUNDS = dict(connect_timeout_s=1.0, request_timeout_s=1.0, call_timeout_s=2.0)
# Spark's reader may make two s3a calls on a path before it gives up (measured: 31 s after the freeze, the
# second a getFileStatus failing at 15 s); the rest of the run fails at once. On main: 240 s and more.
LIMIT = 2 * S3A_FLOOR_S + 15.0


def _commits(root: str) -> list[str]:
    """Every Delta log entry under the root: what a reader of any of its tables can see."""
    return sorted(u for u, _ in storage.list_files(root) if "/_delta_log/" in u)


def _one_clear_line(err: BaseException, endpoint: str, bucket: str) -> str:
    message = str(err)
    assert "\n" not in message and "\x1b" not in message, message
    assert endpoint in message and f"s3://{bucket}/" in message, message
    assert "laminar-local-secret" not in message and "Generic S3 error" not in message, message
    return message


def test_a_frozen_store_fails_the_run_within_its_bounds_and_the_next_run_catches_up(spark, second_s3_server):
    server = second_s3_server
    options = replace(server.options, **BOUNDS)
    root = server.bucket()
    bucket = root.split("/")[2]
    freeze_at: list[str] = []

    def hook(step: str) -> None:
        if step in freeze_at:
            os.kill(server.process.pid, signal.SIGSTOP)

    with storage.mounted("s3://", options), storage.mounted(root, options):  # the engine's mount, undone after
        lake = Lake(root)
        lake.create("trades", BASE)
        engine = Engine(spark, root, store=options, hook=hook)
        engine.run(FLOW, H0)
        lake.append("trades", MORE)
        sink, commits = lake.read(FLOW.sink), _commits(root)

        freeze_at.append("after_intent")
        started = time.monotonic()
        try:
            with pytest.raises(StoreUnavailableError) as info:
                engine.run(FLOW, H0)
            took = time.monotonic() - started
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        freeze_at.clear()
        assert took < LIMIT, f"the run failed after {took:.0f} s"
        message = _one_clear_line(info.value, server.endpoint, bucket)
        assert "did not answer" in message and info.value.retryable and FLOW.name in message

        time.sleep(options.call_timeout_s)  # the store found not answering is waited on again after this
        assert _commits(root) == commits  # no commit of state or sink: nothing half-written to read
        assert_frames_match(lake.read(FLOW.sink), sink, FLOW.keys)

        engine.run(FLOW, H0)  # the lease the failed run could not release is taken over
        expected = full_recompute(spark, FLOW, lake.table("trades").to_pyarrow_table())
        assert_frames_match(lake.read(FLOW.sink), expected[expected["window_start"] < "2024-01-01 01:00"],
                            FLOW.keys)


def test_a_killed_store_fails_the_run_at_once_in_one_line(spark, second_s3_server):
    server = second_s3_server
    options = replace(server.options, **BOUNDS)
    root = server.bucket()

    def hook(step: str) -> None:
        if step == "after_intent":
            server.stop()

    with storage.mounted("s3://", options), storage.mounted(root, options):  # the engine's mount, undone after
        lake = Lake(root)
        lake.create("trades", BASE)
        engine = Engine(spark, root, store=options, hook=hook)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            engine.run(FLOW, H0)
        assert time.monotonic() - started < LIMIT
        message = _one_clear_line(info.value, server.endpoint, root.split("/")[2])
        assert "cannot connect" in message and "AWS S3" not in message
