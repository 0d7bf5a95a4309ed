"""Delivering a flow's or stage's Delta table to a real Redis (the session's redis-server, tests/redis_server.py):
after appends, late rows, updates, deletes and refills each key holds the latest row the Delta table has for it
(a deleted latest window falls back to the surviving one, a key with no row left is removed); full resyncs
rewrite every key and remove the rest; a newer key is never overwritten by an older delivery; Redis down, a wrong
password and a missing permission are one line each. No Spark."""

from __future__ import annotations

import http.server as http_server
import logging
import re
import shutil
import threading

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_assets.engine import ConcurrentDeliveryError, Connection, Exporter, ExportError, ExportTargetError, RedisExport
from laminar_assets.engine.export import load_record
from tests.deploy.processes import free_port
from tests.engine.export.helpers import CDF, FLOW, STAGE, Sink, flow_rows, minute
from tests.engine.export.redis_helpers import REDIS_EXPORT, assert_equal, cache, client, deliver, exporter, state


def test_the_cache_holds_each_keys_latest_window_after_appends_late_rows_updates_deletes_and_refills(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")

    def step(mode: str, reason: str):
        result = deliver(root, redis_url)
        assert (result.mode.value, result.reason.value) == (mode, reason), result.detail
        assert_equal(redis_url, sink)
        return result

    assert deliver(root, redis_url).reason.value == "SOURCE_NOT_WRITTEN"
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 10.0), (0, 0, "b", 2, 5.0), (0, 1, "a", 1, 3.5)]))
    first = step("FULL", "NO_DELIVERED_VERSION")
    assert (first.rows_upserted, first.rows_deleted) == (2, 0)  # two keys, a's latest window from the second batch
    # an append: a new partition, every key's latest window moves
    sink.replace_hour(1, flow_rows([(1, m, s, m + 1, float(m)) for m in range(3) for s in "ab"]))
    assert step("INCREMENTAL", "NEW_VERSIONS").rows_upserted == 2
    # late rows into the older partition (a new key 'c' among them): a and b keep their later windows
    sink.replace_hour(0, flow_rows([(0, 0, "a", 9, 10.0), (0, 0, "b", 2, 5.0), (0, 7, "c", 1, 1.0)]))
    assert step("INCREMENTAL", "NEW_VERSIONS").rows_upserted == 1
    # an update of a's latest window; a delete of b's latest window: b falls back to its surviving window 01:01
    sink.table().update(updates={"n": "n + 100"}, predicate="sym = 'a'")
    sink.table().delete("sym = 'b' AND window_start >= '2024-01-02T01:02:00Z'")
    both = step("INCREMENTAL", "NEW_VERSIONS")
    assert cache(redis_url)["pos:b"]["window_start"] == minute(1, 1) and both.rows_deleted == 0
    # every row of c deleted: its key is removed
    sink.table().delete("sym = 'c'")
    assert step("INCREMENTAL", "NEW_VERSIONS").rows_deleted == 1 and "pos:c" not in cache(redis_url)
    # a refill of partition 1 that drops a's windows there and b's but one: a falls back to partition 0
    sink.replace_hour(1, flow_rows([(1, 0, "b", 3, 2.0)]))
    step("INCREMENTAL", "NEW_VERSIONS")
    assert cache(redis_url)["pos:a"]["window_start"] == minute(0, 0)
    # every file rewritten without change data (a flow's sink commit), with one window changed
    sink.rewrite(flow_rows([(0, 0, "a", 1, 10.0), (1, 0, "b", 4, 2.0), (1, 5, "z", 1, 1.0)]))
    step("INCREMENTAL", "NEW_VERSIONS")
    step("NOOP", "UP_TO_DATE")
    assert load_record(root, "m1_cache").delivered_version == sink.version()


def test_a_stage_holds_the_row_of_each_dedup_key_with_its_latest_event_time(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    export = RedisExport(name="st_cache", source="st", connection="cache", key_prefix="st")
    rows = pa.table({"id": [1, 2, 1], "ts": pa.array([minute(0, 1), minute(0, 2), minute(1, 1)], pa.timestamp("us", "UTC")),
                     "px": [1.0, 2.0, 3.0]})
    write_deltalake(f"{root}/st", rows, configuration=CDF)
    sink = Sink(root, "st")
    check = dict(group=("id",), time="ts", prefix="st", export="st_cache")
    deliver(root, redis_url, export, STAGE)
    assert_equal(redis_url, sink, **check)
    assert cache(redis_url, "st")["st:1"]["px"] == 3.0  # id 1 has a row in two partitions: the later one
    sink.table().delete("id = 1 AND ts >= '2024-01-02T01:00:00Z'")  # its later row goes: the earlier one is back
    sink.table().update(updates={"px": "px * 10"}, predicate="id = 2")
    result = deliver(root, redis_url, export, STAGE)
    assert (result.rows_upserted, result.rows_deleted) == (2, 0)
    assert_equal(redis_url, sink, **check)
    assert cache(redis_url, "st")["st:1"]["px"] == 1.0
    sink.table().delete("id = 2")
    assert deliver(root, redis_url, export, STAGE).rows_deleted == 1
    assert_equal(redis_url, sink, **check)


def test_a_full_resync_rewrites_every_key_and_removes_those_the_table_no_longer_has(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    deliver(root, redis_url)
    with client(redis_url) as c:  # an edited field, a key Laminar wrote that the table no longer has, another's keys
        c.hset("pos:a", "n", "-1")
        c.hset("pos:gone", mapping={"n": "1", "_laminar_version": "0"})
        c.hset("pos:x:y", mapping={"n": "1", "_laminar_version": "0"})  # two values: not a key of this export's shape
        c.set("posx", "another app's")
    result = deliver(root, redis_url, full=True)
    assert (result.mode.value, result.reason.value, result.rows_upserted, result.rows_deleted) == (
        "FULL", "FORCED_BY_USER", 1, 1)
    with client(redis_url) as c:
        assert c.exists("pos:gone") == 0 and c.exists("pos:x:y") == 1 and c.get("posx") == "another app's"
        c.delete("pos:x:y")
    assert_equal(redis_url, sink)
    # the source table recreated at its path at a lower version: every key rewritten (its versions start again)
    shutil.rmtree(sink.uri)
    sink.replace_hour(2, flow_rows([(2, 9, "a", 7, 0.5)]))
    result = deliver(root, redis_url)
    assert (result.mode.value, result.reason.value) == ("FULL", "SOURCE_RECREATED")
    assert_equal(redis_url, sink)
    # the change files since the delivered version vacuumed away: a full resync, not a failure
    sink.replace_hour(2, flow_rows([(2, 9, "a", 8, 0.5), (2, 10, "q", 1, 1.0)]))
    sink.rewrite(flow_rows([(2, 10, "q", 2, 1.0)]))
    sink.table().vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    result = deliver(root, redis_url)
    assert (result.mode.value, result.reason.value) == ("FULL", "CHANGE_FEED_EXPIRED")
    assert_equal(redis_url, sink)


def test_a_key_not_written_by_laminar_under_the_prefix_is_refused_before_its_batch_writes(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    Sink(root, "m1").replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    with client(redis_url) as c:
        c.set("pos:a", "a string of another app")
    with pytest.raises(ExportError) as info:
        deliver(root, redis_url)
    text = str(info.value)
    assert "Redis key 'pos:a'" in text and "holds a string that Laminar did not write" in text and "\n" not in text
    with client(redis_url) as c:
        assert c.get("pos:a") == "a string of another app" and not c.exists("laminar:exports:m1_cache")


def test_an_older_delivery_after_a_newer_one_changes_nothing(tmp_path, redis_url):
    """A delivery that read its changes, then finds that a newer one delivered meanwhile, writes nothing; and a key
    whose version is newer than a delivery's keeps its row."""
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 0, "b", 1, 1.0)]))
    deliver(root, redis_url)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 1.0), (0, 0, "b", 1, 1.0)]))  # version 1: a changes

    def newer_first(step: str) -> None:
        if step == "export_before_write":  # this delivery holds version 1's changes; version 2 is delivered first
            sink.table().delete("sym = 'a'")
            assert deliver(root, redis_url).to_version == 2

    with pytest.raises(ConcurrentDeliveryError) as info:
        deliver(root, redis_url, hook=newer_first)
    assert info.value.retryable and "another delivery moved the delivered version" in str(info.value)
    assert_equal(redis_url, sink)  # a is not back
    # per key: a row stamped with a newer version than the delivery's is left as it is
    sink.replace_hour(0, flow_rows([(0, 0, "b", 5, 1.0)]))
    with client(redis_url) as c:
        c.hset("pos:b", "_laminar_version", "99")
    result = deliver(root, redis_url)
    assert result.extra == {"keys_skipped_newer": 1} and cache(redis_url)["pos:b"]["n"] == 1


def test_redis_down_a_wrong_password_and_a_missing_permission_are_one_line_each(tmp_path, redis_server, redis_url,
                                                                               monkeypatch, caplog):
    root = str(tmp_path / "lake")
    Sink(root, "m1").replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    with client(redis_url) as c:
        c.acl_setuser("laminar_pw", enabled=True, passwords=["+right-password"], keys=["*"], commands=["+@all"])
        c.acl_setuser("reader", enabled=True, nopass=True, keys=["*"], commands=["+@read", "+@connection"])
    port = free_port()
    cases = {
        "down": (f"redis://etl:s3cret-down@127.0.0.1:{port}/0",
                 f"cannot reach Redis at host=127.0.0.1 port={port} db=0 as user 'etl' (Connection refused)", True),
        "password": (redis_server.url(user="laminar_pw", password="s3cret-wrong"),
                     f"Redis at host=127.0.0.1 port={redis_server.port} db=0 refused the credentials of user "
                     "'laminar_pw'", False),
        "permission": (redis_server.url(user="reader"), "Redis user 'reader' at host=127.0.0.1", False),
    }
    caplog.set_level(logging.DEBUG)
    for name, (url, expected, retryable) in cases.items():
        with pytest.raises(ExportTargetError) as info:
            Exporter(root, connections={"cache": Connection("cache", url)}).deliver(REDIS_EXPORT, FLOW)
        text = str(info.value)
        assert expected in text and "\n" not in text and "s3cret" not in text, (name, text)
        assert info.value.retryable is retryable, name
        assert load_record(root, "m1_cache").failed["error"] == info.value.message
    assert load_record(root, "m1_cache").failed["count"] == 3
    assert "s3cret" not in caplog.text and "s3cret" not in open(f"{root}/_laminar/exports/m1_cache.json").read()
    assert cache(redis_url) == {} and state(redis_url) == {}  # nothing written
    # the right password, kept out of the URL (LAMINAR_CONNECTION_<NAME>_PASSWORD)
    monkeypatch.setenv("LAMINAR_CONNECTION_CACHE_URL", redis_server.url(user="laminar_pw"))
    monkeypatch.setenv("LAMINAR_CONNECTION_CACHE_PASSWORD", "right-password")
    assert Exporter(root).deliver(REDIS_EXPORT, FLOW).rows_upserted == 1
    assert load_record(root, "m1_cache").failed is None


def test_a_backfill_of_a_partition_recomputes_the_keys_with_rows_there(tmp_path, redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    deliver(root, redis_url)
    with client(redis_url) as c:
        c.hset("pos:a", "n", "-1")
    result = exporter(root, redis_url).deliver(REDIS_EXPORT, FLOW, partitions=["2024-01-02-00:00"])
    assert (result.reason.value, result.rows_upserted) == ("PARTITIONS_REPLACED", 1)
    assert_equal(redis_url, sink)


class _QuietHandler(http_server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_connection_that_is_not_a_redis_server_is_one_line_before_anything_is_written(tmp_path, redis_server,
                                                                                        redis_url, monkeypatch):
    """Undefined, not a Redis URL, an unusable one, and a URL where another kind of server answers (a real HTTP
    server on 127.0.0.1): one line each naming the export, the connection and what was expected."""
    root = str(tmp_path / "lake")
    Sink(root, "m1").replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    http = http_server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    monkeypatch.delenv("LAMINAR_CONNECTION_CACHE_URL", raising=False)
    try:
        cases = {
            "undefined": (None, "export 'm1_cache' names connection 'cache', which is not defined: set "
                                "LAMINAR_CONNECTION_CACHE_URL (e.g. redis://[user@]host:6379/0"),
            "scheme": ("postgresql://etl:s3cret@127.0.0.1:5432/db", "export 'm1_cache': connection 'cache' is not a "
                       "Redis URL (postgresql://etl:***@127.0.0.1:5432/db); expected redis://"),
            "database": (f"redis://127.0.0.1:{redis_server.port}/first", "connection 'cache' is not a usable Redis URL (redis://127.0.0.1:"
                         f"{redis_server.port}/first): its database 'first' is not a number"),
            "not-redis": (f"redis://127.0.0.1:{http.server_address[1]}/0",
                          f"the server at host=127.0.0.1 port={http.server_address[1]} db=0 closed the connection without a "
                          "Redis answer"),
        }
        for name, (url, expected) in cases.items():
            given = {} if url is None else {"cache": Connection("cache", url)}
            with pytest.raises(ExportError) as info:
                Exporter(root, connections=given).deliver(REDIS_EXPORT, FLOW)
            text = str(info.value)
            assert expected in text and "\n" not in text and "s3cret" not in text, (name, text)
            assert load_record(root, "m1_cache").failed["error"] == info.value.message
    finally:
        http.shutdown()
        http.server_close()
    assert cache(redis_url) == {} and state(redis_url) == {}


def test_the_permissions_a_missing_permission_names_are_enough_for_every_kind_of_delivery(tmp_path, redis_server,
                                                                                          redis_url):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    url = redis_server.url(user="etl")
    with client(redis_url) as c:
        c.acl_setuser("etl", enabled=True, nopass=True, keys=["*"], commands=["+@read"])
    with pytest.raises(ExportTargetError) as info:
        deliver(root, url)
    grant = re.search(r"ACL SETUSER etl ((?:[+~][^\s;]+ ?)+)", str(info.value)).group(1).split()
    with client(redis_url) as c:  # exactly those, nothing else (reset drops +@read and every key)
        c.execute_command("ACL", "SETUSER", "etl", "reset", "on", "nopass", *grant)
    assert deliver(root, url).mode.value == "FULL"
    sink.table().delete("sym = 'b'")
    assert deliver(root, url).rows_deleted == 1
    assert deliver(root, url, full=True).reason.value == "FORCED_BY_USER"  # SCAN of the prefix too
    assert_equal(redis_url, sink)
