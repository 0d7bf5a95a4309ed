"""What `laminar status`, the `stale_partitions` sensor and the `watermark_lag` check call stale: a table
deleted and created again at the same path (another Delta id, its versions counting from 0 again) is stale
for every partition that read the old one, as a run judges it, even when the new version equals the old."""

from __future__ import annotations

import shutil

from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.engine import Reason
from laminar_assets.engine.report import inspect_partition, is_stale
from laminar_assets.flows import load_specs
from tests.orchestration.pipeline import BASE, create_sources, symbols_frame, trades

STAGE = next(s for s in load_specs() if s.name == "normalized_trades")  # reads raw_trades, joins symbols
P9 = "2024-01-02-09:00"


def up_to_date(lake) -> CheckpointStore:
    """The sources, and a watermark of P9 at their versions and Delta ids (as a finished run leaves it)."""
    create_sources(lake, BASE)
    store = CheckpointStore(lake.root)
    tables = {t: lake.table(t) for t in ("raw_trades", "symbols")}
    store.save(Watermark(STAGE.name, P9, STAGE.spec_hash, {t: dt.version() for t, dt in tables.items()}, 1,
                         source_ids={t: dt.metadata().id for t, dt in tables.items()}, last_mode="REFILL",
                         last_reason="NO_WATERMARK"))
    mark, plan = inspect_partition(lake.root, STAGE, P9, store)
    assert not is_stale(mark, plan), plan
    return store


def recreate(lake, name: str, frame) -> None:
    shutil.rmtree(lake.path(name))
    lake.create(name, frame=frame)  # version 0 again, as the watermark says; another Delta id


def test_a_dimension_recreated_at_the_same_version_is_stale(lake):
    store = up_to_date(lake)
    recreate(lake, "symbols", symbols_frame().assign(sector="Other"))
    mark, plan = inspect_partition(lake.root, STAGE, P9, store)
    assert is_stale(mark, plan) and plan.reason is Reason.DIMENSION_CHANGED, plan
    assert "recreated" in plan.detail


def test_a_source_recreated_at_the_same_version_is_stale(lake):
    store = up_to_date(lake)
    recreate(lake, "raw_trades", trades(BASE[:1]))
    mark, plan = inspect_partition(lake.root, STAGE, P9, store)
    assert is_stale(mark, plan) and "recreated" in plan.detail, plan
