"""The random stateful test of a stage whose deletes and updates recompute the keys they touch (#49):
every step of the general machine plus corrections, with the same invariants, in shards of their own
(tests/engine/test_stateful.py), with the stage's exports (Postgres, Redis, webhook: tests/engine/stateful_exports.py)
delivering after its runs, the corrections' key refills among them."""

from __future__ import annotations

import pytest

from tests.conftest import shard_size, shards
from tests.engine.stateful_lake import StageLakeMachine
from tests.engine.test_stateful import EXAMPLES, run_shard

pytestmark = pytest.mark.spark

SHARDS = 2


@shards(SHARDS)
def test_random_stage_histories_keep_every_invariant(spark, pg_server, redis_server, webhook_receiver, shard):
    """The same invariants where the stage recomputes the keys deletes and updates touch (#49), exports' included
    (#61): a refilled key's rows reach each target as the stage now holds them."""
    StageLakeMachine.spark = spark
    run_shard(StageLakeMachine, shard, shard_size(max(1, EXAMPLES // 8), SHARDS, shard),
              servers={"pg_server": pg_server, "redis_server": redis_server, "webhook_receiver": webhook_receiver})
