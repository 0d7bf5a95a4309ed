"""`python -m bench.alternate_streaming` (the README's command for the Laminar / streaming ratio)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import alternate_streaming

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.spark
def test_it_times_both_on_each_delta_and_prints_the_median_ratio():
    """Its own process and JVM (it stops its session), a tiny base, two rounds: both orders run."""
    done = subprocess.run([sys.executable, "-m", "bench.alternate_streaming", "--rows", "20000", "--rounds", "2",
                           "--skip", "1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("round 1 (Laminar first)") for line in lines), done.stdout
    assert any(line.startswith("round 2 (stream first)") for line in lines), done.stdout
    assert lines[-1].startswith("rounds 2-2: Laminar median") and "ratio median" in lines[-1], done.stdout


def test_more_rounds_than_skipped_ones_are_required():
    with pytest.raises(SystemExit) as exc:
        alternate_streaming.main(["--rounds", "2", "--skip", "2"])
    assert exc.value.code == 2
