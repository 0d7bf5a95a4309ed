"""The stage-corrections benchmark (bench/stage_corrections.py) at a tiny size: both paths run, the
keyed one recomputes keys, and the outputs are compared (it exits on a difference)."""

from __future__ import annotations

import json

import pytest

from bench import stage_corrections

pytestmark = pytest.mark.spark


def test_both_paths_agree_and_the_keyed_one_recomputes_keys(spark, tmp_path):
    line = stage_corrections.measure(spark, 600, 2, 2, str(tmp_path))
    json.dumps(line)
    assert line["outputs_equal"] and all(0 < k <= 22 for k in line["keys_per_round"])
    assert line["whole_s"] > 0 and line["keys_s"] > 0
