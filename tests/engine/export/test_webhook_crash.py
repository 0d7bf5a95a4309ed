"""A webhook delivery stopped at each of its steps (before the first request, after a request, after every
request and the dead letters but before the delivered version, after the version, after the lake's record),
injected and by a real SIGKILL, then run again: every row reaches the webhook_receiver at least once, none is lost,
a row sent twice has the same idempotency key both times, a dead letter is not written twice, and later rows
go out once. No Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import defaultdict

import pytest

from laminar_assets.engine.export import EXPORT_STEPS, load_record
from laminar_assets.errors import InjectedCrash
from tests.engine.export.helpers import crash_at
from tests.engine.export.receiver import OK
from tests.engine.export.webhook_helpers import HOOK, STAGE, Trades, dead_letters, exporter, row_of

STEPS = ("export_after_request", *EXPORT_STEPS)
ROWS = [(m, f"s{m}", float(m)) for m in range(1, 6)]


def _keys_by_row(webhook_receiver) -> dict[tuple, set[str]]:
    out = defaultdict(set)
    for e in webhook_receiver.events():
        out[row_of(e)].add(e["idempotency_key"])
    return out


def _lake(tmp_path, webhook_receiver) -> tuple[str, Trades]:
    root = str(tmp_path / "lake")
    sink = Trades(root)
    sink.append((0, "old", 1.0))
    exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)  # delivered version 0 (initial="skip")
    sink.append(*ROWS)
    return root, sink


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_each_step_then_a_rerun_delivers_every_row_at_least_once_under_one_key(tmp_path, webhook_receiver, step):
    root, sink = _lake(tmp_path, webhook_receiver)
    with pytest.raises(InjectedCrash):
        exporter(root, webhook_receiver.url, hook=crash_at(step)).deliver(HOOK, STAGE)
    crashed = len(webhook_receiver.events())
    # a request the receiver took but whose answer came after the client's 0.3 s timeout (a loaded machine) is
    # sent again under its key: count rows by key, not requests
    sent = {(row_of(e), e["idempotency_key"]) for e in webhook_receiver.events()}
    assert len(sent) == (0 if step == "export_before_write" else len(ROWS) if step != "export_after_request"
                         else len(sent))
    result = exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)
    recorded = step in ("export_after_version", "export_after_commit")
    assert result.mode.value == ("NOOP" if recorded else "INCREMENTAL")
    assert result.delivered_version == sink.version() == load_record(root, HOOK.name).delivered_version
    keys = _keys_by_row(webhook_receiver)
    assert sorted(keys) == ROWS  # none lost
    assert all(len(k) == 1 for k in keys.values())  # sent twice at most under the same key
    if recorded:
        assert len(webhook_receiver.events()) == crashed  # the version was recorded: nothing sent again
    webhook_receiver.clear()
    sink.append((9, "later", 9.0))
    exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)
    assert {(row_of(e), e["idempotency_key"]) for e in webhook_receiver.events()} == {
        ((9, "later", 9.0), webhook_receiver.events()[0]["idempotency_key"])}  # once (a resend keeps its key)


def test_a_crash_after_the_dead_letters_then_a_rerun_does_not_write_them_twice(tmp_path, webhook_receiver):
    root, sink = _lake(tmp_path, webhook_receiver)
    webhook_receiver.default = 500
    with pytest.raises(InjectedCrash):
        exporter(root, webhook_receiver.url, hook=crash_at("export_after_rows")).deliver(HOOK, STAGE)
    assert len(dead_letters(root)) == len(ROWS)
    result = exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)  # the same rows fail again
    assert (result.extra["dead_letters"], result.delivered_version) == (0, sink.version())
    assert sorted(d["idempotency_key"] for d in dead_letters(root)) == sorted({r.key for r in webhook_receiver.received})
    assert len(dead_letters(root)) == len(ROWS)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from laminar_assets.engine import Connection, Exporter
    from tests.engine.export.webhook_helpers import HOOK, STAGE
    def hook(step):
        if step == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)
    Exporter(sys.argv[1], connections={"alerts": Connection("alerts", sys.argv[2])}, hook=hook).deliver(HOOK, STAGE)
""")


@pytest.mark.parametrize("step", ["export_after_request", "export_after_version"])
def test_sigkill_during_a_delivery_then_a_rerun_loses_nothing(tmp_path, webhook_receiver, step):
    """A process killed after its first answer (the other requests cut off), or after recording its version."""
    root, sink = _lake(tmp_path, webhook_receiver)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, root, webhook_receiver.url, step], cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert webhook_receiver.events(answered=OK)  # it did send before it died
    result = exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)
    assert result.delivered_version == sink.version()
    assert result.mode.value == ("NOOP" if step == "export_after_version" else "INCREMENTAL")
    keys = _keys_by_row(webhook_receiver)
    assert sorted(keys) == ROWS and all(len(k) == 1 for k in keys.values())


def test_a_row_a_killed_delivery_sent_then_deleted_is_retracted(tmp_path, webhook_receiver):
    """A delivery sends a new row and is killed before it records its version; the row is deleted before the next
    delivery, which covers both commits. The receiver got the row: with retractions="send" it must get its
    retraction too (the next delivery sent neither, the two commits cancelling out, so the receiver kept a row
    the table no longer has)."""
    from collections import Counter

    from tests.engine.export.webhook_helpers import hook

    root = str(tmp_path / "lake")
    sink, export = Trades(root), hook(retractions="send")
    sink.append((0, "old", 1.0))
    exporter(root, webhook_receiver.url).deliver(export, STAGE)
    sink.append((1, "r", 1.0))
    with pytest.raises(InjectedCrash):
        exporter(root, webhook_receiver.url, hook=crash_at("export_after_rows")).deliver(export, STAGE)
    sink.table().delete("sym = 'r'")
    exporter(root, webhook_receiver.url).deliver(export, STAGE)
    held, seen = Counter(), set()
    for e in webhook_receiver.events():  # a receiver dropping the keys it has seen, applying the rest
        if e["idempotency_key"] not in seen:
            seen.add(e["idempotency_key"])
            held[row_of(e)] += 1 if e["op"] == "insert" else -1
    assert +held == Counter(), [(e["op"], e["version"], row_of(e)) for e in webhook_receiver.events()]
