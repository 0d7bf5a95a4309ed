"""What `laminar serve` says when a process of the deployment dies: which one, from `dagster dev`'s log (the
message pointed at the log folder only, while the cause, e.g. the daemon killed, was a line in it)."""

from __future__ import annotations

from laminar_assets.cli.run_commands import _last_exit_line

LOG = """\x1b[32m2026-12-06 04:11:29 +0000\x1b[0m - dagster.daemon.SensorDaemon - \x1b[34mINFO\x1b[0m - Checking for new runs
2026-12-06 04:11:28 +0000 - dagster - DEBUG - job - 67237aba - 14197 - normalized_trades - STEP_START - Started
\x1b[32m2026-12-06 04:11:30 +0000\x1b[0m - dagster - \x1b[34mERROR\x1b[0m - \x1b[31mAn unexpected exception has occurred\x1b[0m
Traceback (most recent call last):
  File "/x/dagster/_cli/dev.py", line 304, in dev_command_impl
    raise Exception(
Exception: dagster-daemon process shut down unexpectedly with return code -9
\x1b[32m2026-12-06 04:11:30 +0000\x1b[0m - dagster - \x1b[34mINFO\x1b[0m - Shutting down Dagster services...
"""


def test_the_line_naming_the_process_that_died_is_found_without_colours(tmp_path):
    log = tmp_path / "dagster.log"
    log.write_text("filler line\n" * 20000 + LOG)
    assert _last_exit_line(str(log)) == "dagster-daemon process shut down unexpectedly with return code -9"


def test_no_such_line_or_no_log_says_nothing(tmp_path):
    log = tmp_path / "dagster.log"
    log.write_text("2026-12-06 04:11:28 +0000 - dagster - INFO - Launching\n")
    assert _last_exit_line(str(log)) == ""
    assert _last_exit_line(str(tmp_path / "missing.log")) == ""
