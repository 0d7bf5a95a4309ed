"""The random stateful test (tests/engine/stateful_lake.py) with the whole lake in a bucket of a
local S3 server (moto): fewer histories than the local run, the same invariants after every step."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.engine.stateful_lake import LakeMachine
from tests.object_store import using

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_S3_EXAMPLES", "20"))
STEPS = int(os.environ.get("LAMINAR_STATEFUL_STEPS", "10"))


def test_random_histories_on_s3_keep_every_invariant(spark, s3_server):
    LakeMachine.spark, LakeMachine.s3 = spark, s3_server
    try:
        with using(s3_server):
            run_state_machine_as_test(LakeMachine, settings=settings(
                max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True))
    finally:
        LakeMachine.s3 = None
