"""The local S3 server (deploy/local_s3.py): its request counts, where its recording lives, and the latency
it can sleep before each request (measured as a lower bound, never as a speed target)."""

from __future__ import annotations

import os
import time

import pytest

from bench.request_log import RequestLog
from laminar_assets.deploy.local_s3 import LocalS3
from laminar_assets.errors import LaminarError


def test_it_counts_requests_by_kind_only_while_counting_and_leaves_no_file_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # moto's recorder used to write `moto_recording` into the working directory
    with LocalS3() as server:
        server.create_bucket("counted")
        client = server.options.client()
        client.put_object(Bucket="counted", Key="before", Body=b"not counted")
        server.start_counting()
        client.put_object(Bucket="counted", Key="a/b", Body=b"x")
        client.get_object(Bucket="counted", Key="a/b")
        client.head_object(Bucket="counted", Key="a/b")
        client.list_objects_v2(Bucket="counted", Prefix="a/")
        client.delete_object(Bucket="counted", Key="a/b")
        assert server.counts() == {"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 1}
        recording = server._recording_dir
        assert recording and os.path.isdir(recording)
    assert not os.path.exists(recording)
    assert os.listdir(tmp_path) == []


def test_a_latency_is_slept_before_each_s3_request_and_the_requests_are_still_recorded():
    latency_s = 0.25
    with LocalS3(latency_ms=latency_s * 1000) as server:
        assert server.server_latency_ms() == 250
        server.create_bucket("slow")
        client = server.options.client()
        server.start_counting()
        started = time.perf_counter()
        client.put_object(Bucket="slow", Key="a", Body=b"x")
        client.get_object(Bucket="slow", Key="a")["Body"].read()
        client.list_objects_v2(Bucket="slow", Prefix="a")
        took = time.perf_counter() - started
        assert server.counts() == {"PUT": 1, "GET": 1, "LIST": 1}  # one request each, none retried
    assert took >= 3 * latency_s, f"3 requests at {latency_s} s each took {took:.3f} s"


def test_control_calls_and_measurement_markers_skip_the_latency_and_it_changes_while_running():
    with LocalS3() as server:
        server.set_latency(5000)  # were they delayed, the calls below would take 5 s each
        assert server.server_latency_ms() == 5000 and server.latency_ms == 5000
        started = time.perf_counter()
        server.start_counting()  # /moto-api/ calls
        RequestLog(server.endpoint).mark("lease")  # a phase marker: header X-Laminar-No-Latency
        counts = server.counts()
        took = time.perf_counter() - started
        assert counts == {"HEAD": 1}  # the marker is still recorded
        assert took < 5, f"control calls and a marker took {took:.1f} s: the latency was slept before them"
        server.set_latency(0)
        assert server.server_latency_ms() == 0


@pytest.mark.parametrize("latency", [-1, float("nan"), float("inf")])
def test_a_latency_below_zero_or_not_a_number_is_refused_before_anything_starts(latency):
    with pytest.raises(LaminarError, match="latency"):
        LocalS3(latency_ms=latency)
    server = LocalS3()
    with pytest.raises(LaminarError, match="latency"):
        server.set_latency(latency)
    assert server.process is None


def test_requests_served_at_once_are_each_recorded_whole():
    """moto's recorder appended a request in two unlocked writes; parallel uploads interleaved them into lines
    that hold two requests, and the counts could not be read. The server records one request at a time."""
    from concurrent.futures import ThreadPoolExecutor

    body = os.urandom(512 * 1024)  # recorded base64-encoded: large writes, so interleaving would show
    with LocalS3() as server:
        server.create_bucket("parallel")
        client = server.options.client()
        server.start_counting()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: client.put_object(Bucket="parallel", Key=f"k{i}", Body=body), range(16)))
        assert server.counts() == {"PUT": 16}
