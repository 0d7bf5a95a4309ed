"""The random stateful test (tests/engine/stateful_lake.py) with the whole lake in a bucket of a
local S3 server (moto): fewer histories than the local run, the same invariants after every step."""

from __future__ import annotations

import os

import pytest

from tests.conftest import shard_size, shards
from tests.engine.stateful_lake import LakeMachine
from tests.engine.test_stateful import run_shard
from tests.object_store import using

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_S3_EXAMPLES", "20"))
SHARDS = 2


@shards(SHARDS)
def test_random_histories_on_s3_keep_every_invariant(spark, s3_server, shard):
    LakeMachine.spark, LakeMachine.s3 = spark, s3_server
    try:
        with using(s3_server):
            run_shard(LakeMachine, 100 + shard, shard_size(EXAMPLES, SHARDS, shard))
    finally:
        LakeMachine.s3 = None
