"""The S3 variant's rounds at several latencies (bench/object_store.py), from fake rounds (no Spark, no
server): seconds side by side, the share of the latency that was waited, and request counts that must not
depend on the latency."""

from __future__ import annotations

import copy

from bench import render
from bench.object_store import _same_requests, _summary


def _round(ms: float, inc: tuple[float, float], full: float, stream: float) -> dict:
    flows = {name: {"seconds": s, "partitions": 6, "modes": ["INCREMENTAL/APPEND_ONLY"],
                    "requests": {"GET": 20, "PUT": 10}, "requests_total": 30, "requests_per_partition": 5.0,
                    "requests_by_phase": {"pass": 25, "lease": 5}, "requests_by_object": {"sink files": 30},
                    "noop": {"seconds": s / 10, "modes": ["NOOP/NO_NEW_COMMITS"], "requests": {"LIST": 3},
                             "requests_total": 3, "requests_by_object": {"watermark": 3}}}
             for name, s in zip(("bench_vwap_1m", "bench_ohlc_5m"), inc, strict=True)}
    return {"base_rows": 1000, "delta_rows": 100, "server": "moto", "latency_ms": ms,
            "request_kinds": ["LIST", "GET", "HEAD", "PUT", "POST", "DELETE"],
            "laminar_batched_per_flow": flows, "t_incremental_batched_s": sum(inc),
            "full_recompute_requests": {"GET": 100}, "t_full_recompute_s": full,
            "streaming_requests": {"GET": 50}, "t_structured_streaming_s": stream,
            "ratio_inc_batched_vs_full": round(sum(inc) / full, 4),
            "ratio_inc_batched_vs_streaming": round(sum(inc) / stream, 4), "results_equal": True,
            "dominant_request": "GET", "equality": {}}


def test_the_share_of_the_latency_waited_is_100_percent_when_requests_wait_one_after_another():
    zero, slow = _round(0, (1.0, 1.0), 5.0, 2.0), _round(20, (1.6, 1.6), 6.0, 2.5)
    summary = _summary(slow, zero)
    # Laminar: 60 requests, +1.2 s at 20 ms = 60 x 20 ms: all serial; the full recompute: 100 requests, +1 s: half
    assert summary["added_s"] == {"laminar": 1.2, "full_recompute": 1.0, "streaming": 0.5}
    assert summary["added_latency_share_pct"] == {"laminar": 100.0, "full_recompute": 50.0, "streaming": 50.0}
    assert summary["requests_laminar"] == 60 and summary["requests_noop"] == 6
    assert "added_s" not in _summary(zero, zero)


def test_requests_that_differ_between_latencies_are_reported_by_what_made_them():
    zero = _round(0, (1.0, 1.0), 5.0, 2.0)
    slow = _round(20, (1.6, 1.6), 6.0, 2.5)
    assert _same_requests({"0ms": zero, "20ms": slow}) == {"laminar": True, "laminar_noop": True, "full_recompute": True,
                                                   "streaming": True, "differences": []}
    retried = copy.deepcopy(slow)
    retried["laminar_batched_per_flow"]["bench_ohlc_5m"]["requests_by_phase"] = {"pass": 26, "lease": 4}
    retried["streaming_requests"] = {"GET": 51}
    same = _same_requests({"0ms": zero, "20ms": retried})
    assert not same["laminar"] and not same["streaming"] and same["full_recompute"] and same["laminar_noop"]
    assert len(same["differences"]) == 2 and same["differences"][0].startswith("laminar at 20ms")


def test_the_report_shows_each_latency_and_says_whether_the_requests_were_the_same():
    zero, slow = _round(0, (1.0, 1.0), 5.0, 2.0), _round(20, (1.6, 1.6), 6.0, 2.5)
    section = {**zero, "by_latency": {"0ms": _summary(zero, zero), "20ms": _summary(slow, zero)},
               "requests_same_at_every_latency": _same_requests({"0ms": zero, "20ms": slow})}
    text = "\n".join(render._s3_section(section))
    assert "| 0ms | 2.00 | 0.20 | 5.00 | 2.00 |" in text
    assert "| 20ms | 3.20 | 0.32 | 6.00 | 2.50 |" in text
    assert "laminar 100.0 % (+1.20 s)" in text and "laminar yes" in text
    only_zero = "\n".join(render._s3_section({**zero, "by_latency": {"0ms": _summary(zero, zero)}}))
    assert "request counts, not these seconds" in only_zero and "| 20ms" not in only_zero
