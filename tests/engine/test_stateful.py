"""The random stateful test (tests/engine/stateful_lake.py) in CI: LAMINAR_STATEFUL_EXAMPLES histories
of up to LAMINAR_STATEFUL_STEPS steps, the same ones every run (each shard has a fixed seed). `make soak`
runs thousands with a seed and a time budget (tests/soak.py).

The histories are split into shards that `make test` hands to its processes one by one (a shard is a
few minutes; the whole test in one process kept it busy for a quarter of an hour)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.conftest import shard_size, shards
from tests.engine.stateful_lake import LakeMachine

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_EXAMPLES", "160"))
STEPS = int(os.environ.get("LAMINAR_STATEFUL_STEPS", "10"))
SHARDS = 8


def run_shard(machine: type, shard: int, examples: int, *, servers: dict | None = None, **extra) -> None:
    """`examples` histories of `machine` with seed `shard` (a subclass carries the seed and `servers`, the
    export targets' servers, so the machine class itself is left as it was: another test in the process
    gets no exports it did not ask for)."""
    seeded = seed(shard)(type(f"{machine.__name__}Shard{shard}", (machine,), dict(servers or {})))
    run_state_machine_as_test(seeded, settings=settings(
        max_examples=examples, stateful_step_count=STEPS, deadline=None, database=None,
        suppress_health_check=list(HealthCheck), print_blob=True, **extra))


@shards(SHARDS)
def test_random_histories_keep_every_invariant(spark, pg_server, redis_server, webhook_receiver, shard):
    """With Postgres, Redis and webhook exports on some specs (tests/engine/stateful_exports.py)."""
    LakeMachine.spark = spark
    run_shard(LakeMachine, shard, shard_size(EXAMPLES, SHARDS, shard),
              servers={"pg_server": pg_server, "redis_server": redis_server, "webhook_receiver": webhook_receiver})
