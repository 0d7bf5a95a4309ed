"""`laminar release FLOW PARTITION...`: the way out when a partition's watermark names a run that died on
another host (its pid means nothing here, so only `lease_seconds` would end the hold)."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from laminar_assets.checkpoints import CheckpointStore, Holder, PendingRun, Watermark
from laminar_assets.cli import app

PART = "2024-01-01-00:00"


def cli(tmp_path, root, *args):
    flows = tmp_path / "flows"
    if not flows.exists():
        flows.mkdir()
        (flows / "f.py").write_text(
            "from laminar_assets.engine import Agg, FlowSpec, Tumbling\n"
            "f = FlowSpec(name='f', source='trades', event_time='ts', window=Tumbling('10m'), keys=('sym',),\n"
            "             aggregates=(Agg.count(),))\n")
    return CliRunner().invoke(app, ["--root", root, "--flows", str(flows), *args],
                              env={"DAGSTER_HOME": str(tmp_path / "dh")})


def test_a_partition_held_by_a_run_on_another_host_is_released_and_a_live_one_here_is_not(tmp_path):
    root = str(tmp_path / "lake")
    store = CheckpointStore(root)
    elsewhere = Holder(run_id="r-away", host="another-host", started=time.time(), pid=1)
    intent = PendingRun(seq=2, run_id="r-away", target_versions={"trades": 3}, mode="INCREMENTAL",
                        reason="APPEND_ONLY")
    store.save(Watermark("f", PART, "h", {"trades": 2}, 1, holder=elsewhere, pending=intent))
    from laminar_assets.engine import Agg, FlowSpec, Tumbling
    from laminar_assets.engine.report.overview import status

    spec = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(),))
    [row] = status(root, [spec])  # `laminar status` names the holder (the source is missing: still reported)
    assert [(h["partition"], h["run_id"], h["host"], h["gone"]) for h in row["held_partitions"]] == [
        (PART, "r-away", "another-host", False)]
    done = cli(tmp_path, root, "release", "f", PART, "2024-01-01-01:00")
    assert done.exit_code == 0, done.output
    assert "released from run r-away pid 1 on another-host; the next run settles its intent" in done.output
    assert "2024-01-01-01:00: no run holds it" in done.output
    after = store.load("f", PART)
    assert after.holder is None and after.pending == intent  # the intent stays for the next run to settle

    with store.hold("f", PART, "r-here"):  # a live run of this very process, on this host
        refused = cli(tmp_path, root, "release", "f", PART)
        assert refused.exit_code != 0 and "alive on this host" in str(refused.exception), refused.exception
        assert store.load("f", PART).holder.run_id == "r-here"
    unknown = cli(tmp_path, root, "release", "nope", PART)
    assert unknown.exit_code != 0 and "unknown flow 'nope'" in str(unknown.exception)
    # a key of another form (the old file name's, an ISO time) is refused, not answered "no run holds it"
    bad = cli(tmp_path, root, "release", "f", "2024-01-01-01:00", "2024-01-01-00-00")
    assert bad.exit_code != 0 and "bad partition for 'f'" in str(bad.exception) and "2024-01-01-00-00" in str(bad.exception)
    assert "no run holds it" not in bad.output  # nothing was released before the check
