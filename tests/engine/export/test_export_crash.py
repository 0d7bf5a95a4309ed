"""A delivery stopped at each of its steps (before the write, after the rows and before the version, after both
and before the commit, after the commit and before the lake's record) leaves the Postgres table as it was or
as it should be, whole; the next delivery converges: the table equals the Delta table, no row twice, none lost,
and later changes apply once. An injected crash at every step, and a real SIGKILL of a child process. No Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from laminar_assets.engine.export import EXPORT_STEPS, load_record
from laminar_assets.errors import InjectedCrash
from tests.engine.export.helpers import (
    EXPORT,
    FLOW,
    Sink,
    change_history,
    crash_at,
    delivered_version,
    exporter,
    flow_rows,
    target_rows,
)


def _converges(root, pg_server, pg_database, sink: Sink) -> None:
    """The next deliveries bring the table to the sink, and later changes apply exactly once."""
    exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW)
    assert target_rows(pg_server, pg_database) == sink.rows()
    assert delivered_version(pg_server, pg_database) == sink.version() == load_record(root, "m1_pg").delivered_version
    sink.replace_hour(1, flow_rows([(1, 0, "d", 1, 1.0)]))
    sink.table().update(updates={"n": "n + 1"}, predicate="sym = 'b'")
    assert exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW).rows_upserted == 2
    assert target_rows(pg_server, pg_database) == sink.rows()


@pytest.mark.parametrize("first", [True, False], ids=["first-delivery", "incremental"])
@pytest.mark.parametrize("step", EXPORT_STEPS)
def test_a_crash_at_each_step_then_a_rerun_converges(tmp_path, pg_server, pg_database, step, first):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    if not first:
        exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW)
        change_history(sink)
    before, before_version = (None, None) if first else (target_rows(pg_server, pg_database), sink.version() - 3)
    with pytest.raises(InjectedCrash):
        exporter(root, pg_server, pg_database, hook=crash_at(step)).deliver(EXPORT, FLOW)
    committed = step == "export_after_commit"
    if committed:  # in the target, whole; the lake's record is one delivery behind
        assert target_rows(pg_server, pg_database) == sink.rows()
        assert delivered_version(pg_server, pg_database) == sink.version()
        record = load_record(root, "m1_pg")
        assert record is None if first else record.delivered_version == before_version
    elif first:  # nothing visible: not even the table the delivery created
        assert delivered_version(pg_server, pg_database) is None
        with pytest.raises(Exception, match="does not exist"):
            target_rows(pg_server, pg_database)
    else:
        assert target_rows(pg_server, pg_database) == before
        assert delivered_version(pg_server, pg_database) == before_version
    result = exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW)
    assert result.mode.value == ("NOOP" if committed else "FULL" if first else "INCREMENTAL")
    _converges(root, pg_server, pg_database, sink)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from laminar_assets.engine import Connection, Exporter
    from tests.engine.export.helpers import EXPORT, FLOW
    def hook(step):
        if step == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)
    Exporter(sys.argv[1], connections={"pg": Connection("pg", sys.argv[2])}, hook=hook).deliver(EXPORT, FLOW)
""")


@pytest.mark.parametrize("step", ["export_after_rows", "export_after_commit"])
def test_sigkill_during_a_delivery_then_a_rerun_converges(tmp_path, pg_server, pg_database, step):
    """A process killed inside the open transaction (Postgres rolls it back when the connection drops), or
    after its commit (before the lake's record)."""
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW)
    before, before_version = target_rows(pg_server, pg_database), sink.version()
    change_history(sink)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, root, pg_server.url(pg_database), step],
                          cwd=os.getcwd(), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr[-2000:]
    if step == "export_after_commit":
        assert target_rows(pg_server, pg_database) == sink.rows()
        assert load_record(root, "m1_pg").delivered_version == before_version  # the record is behind
    else:
        assert target_rows(pg_server, pg_database) == before
        assert delivered_version(pg_server, pg_database) == before_version
    _converges(root, pg_server, pg_database, sink)
