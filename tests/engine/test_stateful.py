"""The random stateful test (tests/engine/stateful_lake.py) in CI: LAMINAR_STATEFUL_EXAMPLES examples
of LAMINAR_STATEFUL_STEPS steps each, the same ones every run (derandomized). `make soak` runs
thousands with a seed and a time budget (tests/soak.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.engine.stateful_lake import LakeMachine

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_EXAMPLES", "200"))
STEPS = int(os.environ.get("LAMINAR_STATEFUL_STEPS", "10"))


@pytest.mark.timeout(1800)  # 200 histories take 12 minutes beside the other process's tests: twice that bounds it
def test_random_histories_keep_every_invariant(spark):
    LakeMachine.spark = spark
    run_state_machine_as_test(LakeMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck), print_blob=True))
