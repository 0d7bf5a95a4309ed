"""Delivering a keyless stage's table (the demo's `large_trades`) to a real HTTP webhook_receiver on 127.0.0.1
(tests/engine/export/webhook_receiver.py): each new row POSTed once with its idempotency key; deletes and corrections as
the `retractions` option says; 500s retried, then dead letters while the export moves on; a webhook_receiver that is
down, hangs or drops connections bounded by the timeouts, failing the delivery without moving it when it never
answers; a delivery out of time keeps what it did and the next one goes on; no secret in any message. No Spark."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from laminar_assets.engine import ExportTargetError
from laminar_assets.engine.export import load_record
from laminar_assets.engine.export.webhook import state_uri
from tests.engine.export.receiver import CLOSE, HANG, OK
from tests.engine.export.webhook_helpers import (
    HOOK,
    STAGE,
    TOKEN,
    Trades,
    dead_letters,
    exporter,
    hook,
    row_of,
)


def _lake(tmp_path, *rows) -> tuple[str, Trades]:
    root = str(tmp_path / "lake")
    sink = Trades(root)
    sink.append(*(rows or [(0, "a", 1.0)]))
    return root, sink


def test_appends_deliver_each_new_row_once_with_its_idempotency_key(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path, (0, "a", 1.0), (1, "b", 2.0))
    ex = exporter(root, webhook_receiver.url)
    first = ex.deliver(HOOK, STAGE)  # initial="skip": the rows already there are not alerts
    assert (first.mode.value, first.reason.value, first.delivered_version) == ("FULL", "NO_DELIVERED_VERSION", 0)
    assert first.extra["rows_skipped"] == 2 and "not sent" in first.detail and webhook_receiver.received == []
    sink.append((2, "c", 3.0), (3, "d", 4.0))
    sink.append((4, "e", 5.0), (4, "e", 5.0))  # the same row twice in one commit: two alerts, two keys
    result = ex.deliver(HOOK, STAGE)
    assert (result.mode.value, result.delivered_version, result.extra["rows_sent"]) == ("INCREMENTAL", 2, 4)
    got = webhook_receiver.received
    assert sorted(row_of(r.body) for r in got) == [(2, "c", 3.0), (3, "d", 4.0), (4, "e", 5.0), (4, "e", 5.0)]
    assert all(r.key == r.body["idempotency_key"] and len(r.key) == 64 for r in got)
    assert len({r.key for r in got}) == 4
    assert {(r.body["op"], r.body["version"], r.body["partition"], r.body["source"]) for r in got} == \
        {("insert", 1, "2024-01-02-00:00", "large_trades"), ("insert", 2, "2024-01-02-00:00", "large_trades")}
    assert {r.headers["authorization"] for r in got} == {f"Bearer {TOKEN}"}
    assert {r.headers["content-type"] for r in got} == {"application/json"}
    assert ex.deliver(HOOK, STAGE).mode.value == "NOOP" and len(webhook_receiver.received) == 4  # nothing twice
    record = load_record(root, HOOK.name)
    assert (record.delivered_version, record.extra["rows_sent"]) == (2, 4)


def test_initial_all_sends_every_row_of_the_first_delivery(tmp_path, webhook_receiver):
    root, _ = _lake(tmp_path, (0, "a", 1.0), (1, "b", 2.0))
    result = exporter(root, webhook_receiver.url).deliver(hook(initial="all"), STAGE)
    assert (result.mode.value, result.rows_upserted, result.delivered_version) == ("FULL", 2, 0)
    assert sorted(row_of(e) for e in webhook_receiver.events()) == [(0, "a", 1.0), (1, "b", 2.0)]


@pytest.mark.parametrize("retractions", ["skip", "send"])
def test_deletes_and_corrections_are_sent_as_retractions_or_not_at_all(tmp_path, webhook_receiver, retractions):
    root, sink = _lake(tmp_path, (0, "a", 1.0), (1, "b", 2.0))
    ex, export = exporter(root, webhook_receiver.url), hook(retractions=retractions)
    ex.deliver(export, STAGE)
    sink.table().delete("sym = 'a'")
    sink.table().update(updates={"px": "px + 10"}, predicate="sym = 'b'")  # a correction: old state out, new in
    result = ex.deliver(export, STAGE)
    got = sorted((e["op"], row_of(e)) for e in webhook_receiver.events())
    if retractions == "skip":
        assert got == [("insert", (1, "b", 12.0))]
    else:
        assert got == [("insert", (1, "b", 12.0)), ("retract", (0, "a", 1.0)), ("retract", (1, "b", 2.0))]
    assert (result.rows_upserted, result.rows_deleted) == (1, 0 if retractions == "skip" else 2)


def test_several_rows_per_request_carry_each_row_with_its_own_key(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex, export = exporter(root, webhook_receiver.url), hook(rows_per_request=2)
    ex.deliver(export, STAGE)
    sink.append((1, "b", 2.0), (2, "c", 3.0), (3, "d", 4.0))
    assert ex.deliver(export, STAGE).extra["requests"] == 2
    sizes = sorted(len(r.events) for r in webhook_receiver.received)
    assert sizes == [1, 2] and len({e["idempotency_key"] for e in webhook_receiver.events()}) == 3
    assert all(r.key not in {e["idempotency_key"] for e in r.events} for r in webhook_receiver.received if len(r.events) > 1)


def test_a_receiver_failing_then_recovering_gets_each_row_after_retries(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex = exporter(root, webhook_receiver.url)
    ex.deliver(HOOK, STAGE)
    sink.append((1, "b", 2.0))
    webhook_receiver.script = [500, CLOSE]  # a 500, then a connection dropped without an answer, then 200
    result = ex.deliver(HOOK, STAGE)
    assert [r.answer for r in webhook_receiver.received] == [500, CLOSE, OK]
    assert len({r.key for r in webhook_receiver.received}) == 1  # the same key on every attempt
    assert (result.extra["retries"], result.extra["dead_letters"], result.delivered_version) == (2, 0, 1)
    assert dead_letters(root) == []


def test_a_receiver_always_failing_sends_rows_to_the_dead_letters_and_the_export_moves_on(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex = exporter(root, webhook_receiver.url)
    ex.deliver(HOOK, STAGE)
    sink.append((1, "b", 2.0), (2, "c", 3.0))
    before = (sink.version(), sink.rows())
    webhook_receiver.rule = lambda body: 400 if body["row"]["sym"] == "c" else None  # refused: not tried again
    webhook_receiver.default = 500
    result = ex.deliver(HOOK, STAGE)
    assert (result.delivered_version, result.extra["dead_letters"], result.extra["rows_sent"]) == (1, 2, 0)
    assert Counter(r.answer for r in webhook_receiver.received) == Counter({500: 3, 400: 1})
    letters = sorted(dead_letters(root), key=lambda d: d["status"])
    assert [(d["status"], d["attempts"], d["op"], d["version"]) for d in letters] == [(400, 1, "insert", 1),
                                                                                       (500, 3, "insert", 1)]
    assert [json.loads(d["row"])["sym"] for d in letters] == ["c", "b"]
    assert letters[1]["error"].startswith("HTTP 500") and letters[1]["partition"] == "2024-01-02-00:00"
    assert {d["idempotency_key"] for d in letters} == {r.key for r in webhook_receiver.received}
    assert (sink.version(), sink.rows()) == before  # the flow's own table is untouched
    webhook_receiver.rule, webhook_receiver.default = None, OK
    webhook_receiver.clear()
    sink.append((3, "d", 4.0))
    ex.deliver(HOOK, STAGE)  # the export moved on: only the new row, the dead letters stay where they are
    assert [row_of(e) for e in webhook_receiver.events()] == [(3, "d", 4.0)] and len(dead_letters(root)) == 2


def test_a_receiver_that_is_down_fails_the_delivery_without_moving_it_then_the_next_one_delivers(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex = exporter(root, webhook_receiver.url)
    ex.deliver(HOOK, STAGE)
    sink.append((1, "b", 2.0), (2, "c", 3.0))
    webhook_receiver.down()
    with pytest.raises(ExportTargetError) as failed:
        ex.deliver(HOOK, STAGE)
    text = str(failed.value)
    assert "cannot reach the webhook at http://127.0.0.1" in text and "Connection refused" in text, text
    assert "the next delivery sends the 2 pending row(s)" in text and failed.value.retryable
    assert "\n" not in text and TOKEN not in text and "/hooks/alerts" not in text
    record = load_record(root, HOOK.name)
    assert (record.delivered_version, record.failed["count"]) == (0, 1)
    assert json.loads(open(state_uri(root, HOOK.name)).read())["delivered_version"] == 0
    assert dead_letters(root) == []
    sink.append((3, "d", 4.0))
    webhook_receiver.up()
    result = ex.deliver(HOOK, STAGE)
    assert result.delivered_version == 2 and load_record(root, HOOK.name).failed is None
    assert sorted(row_of(e) for e in webhook_receiver.events()) == [(1, "b", 2.0), (2, "c", 3.0), (3, "d", 4.0)]


def test_a_hanging_receiver_is_bounded_by_the_timeout(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex, quick = exporter(root, webhook_receiver.url), hook(timeout_seconds=0.3)
    ex.deliver(quick, STAGE)
    sink.append((1, "b", 2.0))
    webhook_receiver.default = HANG  # no answer, ever: each attempt ends at the 0.3 s timeout
    with pytest.raises(ExportTargetError, match=r"no answer within 0\.3s, 3 attempt\(s\)"):
        ex.deliver(quick, STAGE)
    assert len(webhook_receiver.received) == 3
    webhook_receiver.default = OK
    webhook_receiver.rule = lambda body: HANG if body["row"]["sym"] == "c" else None  # one row it chokes on
    webhook_receiver.clear()
    sink.append((2, "c", 3.0), (3, "d", 4.0))
    result = ex.deliver(quick, STAGE)
    assert sorted(row_of(e) for e in webhook_receiver.events()) == [(1, "b", 2.0), (3, "d", 4.0)]
    assert [(d["status"], d["error"], json.loads(d["row"])["sym"]) for d in dead_letters(root)] == \
        [(None, "no answer within 0.3s", "c")]
    assert result.delivered_version == 2


def test_a_receiver_that_stops_answering_keeps_what_was_done_and_the_rest_pending(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    ex, export = exporter(root, webhook_receiver.url), hook(max_in_flight=1)
    ex.deliver(export, STAGE)
    sink.append(*[(m, f"s{m}", float(m)) for m in range(1, 7)])
    webhook_receiver.script = [OK, OK]
    webhook_receiver.default = CLOSE  # then it goes away: no answer to anything
    result = ex.deliver(export, STAGE)
    assert (result.extra["rows_sent"], result.extra["pending_rows"], result.extra["stopped"]) == (2, 4, "stopped answering")
    assert result.delivered_version == 0 and result.lag_versions == 1 and dead_letters(root) == []
    sent = [e["idempotency_key"] for e in webhook_receiver.events()]
    webhook_receiver.default = OK
    webhook_receiver.clear()
    assert ex.deliver(export, STAGE).delivered_version == 1
    rest = [e["idempotency_key"] for e in webhook_receiver.events()]
    assert len(rest) == 4 and not set(rest) & set(sent)  # the next delivery went on from where it stopped


def test_a_delivery_out_of_time_goes_on_next_time_and_loses_nothing(tmp_path, webhook_receiver):
    """Paced at 2 rows a second with a 1 s budget, a delivery sends at most 2 of 8 rows; the next ones go on from
    there, also over a version committed since, and every row arrives once."""
    root, sink = _lake(tmp_path)
    slow = hook(max_rows_per_second=2.0, max_seconds=1.0)
    ex = exporter(root, webhook_receiver.url)
    ex.deliver(slow, STAGE)
    sink.append(*[(m, f"s{m}", float(m)) for m in range(1, 9)])
    result = ex.deliver(slow, STAGE)
    assert result.extra["stopped"] == "out of time" and result.extra["pending_rows"] >= 6, result.to_json()
    assert result.delivered_version == 0 and "pending" in result.detail
    sink.append((20, "late", 1.0))
    fast = hook()
    assert ex.deliver(fast, STAGE).delivered_version == 2
    keys = Counter(e["idempotency_key"] for e in webhook_receiver.events())
    assert len(keys) == 9 and set(keys.values()) == {1}


def test_a_full_delivery_out_of_time_goes_on_with_the_same_snapshot(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path, *[(m, f"s{m}", float(m)) for m in range(6)])
    ex = exporter(root, webhook_receiver.url)
    first = ex.deliver(hook(initial="all", max_rows_per_second=2.0, max_seconds=1.0), STAGE)
    assert first.delivered_version is None and first.extra["pending_rows"] >= 4, first.to_json()
    sink.append((30, "new", 1.0))
    second = ex.deliver(hook(initial="all"), STAGE)  # the rest of version 0's rows, not version 1's table again
    assert (second.mode.value, second.reason.value, second.delivered_version) == ("FULL", "NO_DELIVERED_VERSION", 0)
    assert "the full delivery of version 0 went on after its first" in second.detail and second.lag_versions == 1
    assert ex.deliver(hook(initial="all"), STAGE).delivered_version == 1
    got = Counter(row_of(e) for e in webhook_receiver.events())
    assert sorted(got) == sorted([(m, f"s{m}", float(m)) for m in range(6)] + [(30, "new", 1.0)])
    assert set(got.values()) == {1}


def test_no_secret_in_errors_metadata_or_records(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path)
    secret_path = f"{webhook_receiver.url}/T0001/B0002/XsEcReTpAtH?sig=abc123secret"
    ex = exporter(root, secret_path)
    ex.deliver(HOOK, STAGE)
    sink.append((1, "b", 2.0))
    webhook_receiver.default = 500
    result = ex.deliver(HOOK, STAGE)
    webhook_receiver.down()
    sink.append((2, "c", 3.0))
    with pytest.raises(ExportTargetError) as failed:
        ex.deliver(HOOK, STAGE)
    seen = " ".join([str(failed.value), json.dumps(result.to_json()), open(state_uri(root, HOOK.name)).read(),
                     json.dumps(load_record(root, HOOK.name).to_json()), json.dumps(dead_letters(root), default=str)])
    for secret in (TOKEN, "XsEcReTpAtH", "abc123secret", "/hooks/alerts"):
        assert secret not in seen


def test_a_connection_that_is_no_http_url_is_one_line(tmp_path):
    root, _ = _lake(tmp_path)
    with pytest.raises(ExportTargetError, match=r"connection 'alerts' is not an http\(s\) URL \(ftp://u:\*\*\*@h/x\)"):
        exporter(root, "ftp://u:pw@h/x").deliver(HOOK, STAGE)


def test_partitions_asked_for_send_only_what_is_pending_never_delivered_rows_again(tmp_path, webhook_receiver):
    """A backfill or a materialization of the export alone names partitions: a receiver holds no rows to repair,
    so the delivery sends what is pending, never a partition's delivered rows again under new keys."""
    root, sink = _lake(tmp_path, (0, "a", 1.0))
    ex = exporter(root, webhook_receiver.url)
    ex.deliver(HOOK, STAGE)
    sink.append((1, "b", 2.0))
    result = ex.deliver(HOOK, STAGE, partitions=["2024-01-02-00:00"])
    assert [row_of(e) for e in webhook_receiver.events()] == [(1, "b", 2.0)]
    assert (result.mode.value, result.delivered_version, result.partitions_replaced) == ("INCREMENTAL", 1, ())
    assert "re-sends no partition's rows" in result.detail, result.detail
    again = ex.deliver(HOOK, STAGE, partitions=["2024-01-02-00:00"])
    assert again.mode.value == "NOOP" and len(webhook_receiver.received) == 1
