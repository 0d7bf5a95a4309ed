"""The random stateful test of a stage whose deletes and updates recompute the keys they touch (#49):
every step of the general machine plus corrections, with the same invariants. A file of its own, so
the other test process runs it beside the general machine (tests/engine/test_stateful.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.engine.stateful_lake import StageLakeMachine
from tests.engine.test_stateful import EXAMPLES, STEPS

pytestmark = pytest.mark.spark


def test_random_stage_histories_keep_every_invariant(spark):
    """The same invariants where the stage recomputes the keys deletes and updates touch (#49)."""
    StageLakeMachine.spark = spark
    run_state_machine_as_test(StageLakeMachine, settings=settings(
        max_examples=max(1, EXAMPLES // 8), stateful_step_count=STEPS, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(HealthCheck), print_blob=True))
