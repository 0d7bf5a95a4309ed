"""Project settings from `[tool.laminar]`: the partition start, absolute or relative."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from laminar_assets.errors import EnvironmentProblem
from laminar_assets.pipeline.settings import LaminarSettings, load_settings, project_file, resolve_start

NOW = datetime(2026, 11, 28, 15, 40, tzinfo=UTC)


@pytest.mark.parametrize("text,expected", [
    ("2024-01-01", datetime(2024, 1, 1, tzinfo=UTC)),
    ("2024-01-01T06:00:00", datetime(2024, 1, 1, 6, tzinfo=UTC)),
    ("2024-01-01T06:00:00+01:00", datetime(2024, 1, 1, 5, tzinfo=UTC)),
    ("today", datetime(2026, 11, 28, tzinfo=UTC)),
    ("today - 2 days", datetime(2026, 11, 26, tzinfo=UTC)),
    ("Today-1day", datetime(2026, 11, 27, tzinfo=UTC)),
])
def test_a_start_is_a_date_or_days_before_today(text, expected):
    assert resolve_start(text, NOW) == expected


def test_a_bad_start_says_what_it_expected():
    with pytest.raises(ValidationError, match="expected an ISO date like '2026-11-01' or 'today - 2 days', found 'yesterday'"):
        LaminarSettings(partitions_start="yesterday")


def test_the_demo_project_starts_near_its_data(tmp_path):
    """The repository's flows start two days back: the demo's data (the last 6 hours) is inside, and the
    catalog lists tens of partitions per hourly asset, not ~25,000 since 2024."""
    start = load_settings().partitions_start
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert (today - start).days == 2
    (tmp_path / "pyproject.toml").write_text('[tool.laminar]\npartitions_start = "2025-03-01"\n')
    assert load_settings(tmp_path / "pyproject.toml").partitions_start == datetime(2025, 3, 1, tzinfo=UTC)


def test_the_future_horizon_is_a_duration():
    assert LaminarSettings().future_horizon == timedelta(days=1)
    assert LaminarSettings(future_horizon="6h").future_horizon == timedelta(hours=6)
    with pytest.raises(ValidationError, match="expected a duration like '1m', '15 minutes', '1h' or '1d', found 'soon'"):
        LaminarSettings(future_horizon="soon")


@pytest.mark.parametrize("target", ["log", "https://hooks.example.com/T0/B1", "http://127.0.0.1:9/x",
                                    "my_team.alerts:page_on_call"])
def test_an_alert_target_is_log_a_url_or_a_function(target):
    assert LaminarSettings(alert=target).alert == target


@pytest.mark.parametrize("target", ["not a url", "slack", "my_team.alerts", "my-team.alerts:page", "hooks.example.com/x",
                                    ":page"])
def test_a_wrong_alert_target_fails_where_it_is_written_not_when_a_run_fails(target):
    """Checked when the settings load: found only when a run failed, the alert about it was lost."""
    with pytest.raises(ValidationError, match=r"expected 'log', a webhook URL \(http:// or https://\) or "
                                              rf"'package.module:function', found {re.escape(repr(target))}"):
        LaminarSettings(alert=target)
    with pytest.raises(ValueError, match="expected 'log', a webhook URL"):
        LaminarSettings.check("alert", target)


def test_an_installed_package_reads_the_project_file_of_the_folder_it_runs_in(tmp_path):
    """A checkout reads the pyproject.toml beside the package; an installed package (nothing beside it in
    site-packages) the nearest one with [tool.laminar] from the current folder up, or none."""
    checkout = tmp_path / "checkout"
    (checkout / "laminar_assets").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[tool.laminar]\npartitions_start = "2025-01-01"\n')
    assert project_file(checkout / "laminar_assets", cwd=tmp_path) == checkout / "pyproject.toml"
    installed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "laminar_assets"
    installed.mkdir(parents=True)
    project = tmp_path / "team"
    (project / "defs" / "flows").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.laminar]\npartitions_start = "2025-06-01"\n')
    (project / "defs" / "pyproject.toml").write_text('[project]\nname = "not-laminar-settings"\n')  # no table: skipped
    assert project_file(installed, cwd=project / "defs" / "flows") == project / "pyproject.toml"
    assert load_settings(project_file(installed, cwd=project / "defs")).partitions_start == \
        datetime(2025, 6, 1, tzinfo=UTC)
    assert project_file(installed, cwd=installed) is None  # no project: the defaults
    (project / "pyproject.toml").write_text("[tool.laminar\n")
    with pytest.raises(EnvironmentProblem, match="pyproject.toml is not valid TOML"):
        project_file(installed, cwd=project)


def test_engine_options_come_from_the_project_file_and_a_wrong_one_is_one_line(tmp_path):
    from laminar_assets.engine import EngineOptions

    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.laminar]\nfuture_horizon = "6h"\n[tool.laminar.engine]\nrefill_ratio = 0.25\n'
                    'key_refill_min_bytes = 1024\nextreme_refill = "windows"\npass_seconds = "0.75"\n')
    options = EngineOptions.of(load_settings(path).engine_options())
    assert (options.refill_ratio, options.key_refill_min_bytes, options.extreme_refill, options.pass_seconds) == (
        0.25, 1024, "windows", 0.75)
    assert options.future_horizon == timedelta(hours=6) and options.lease_seconds == EngineOptions().lease_seconds
    with pytest.raises(EnvironmentProblem, match="extreme_refill: expected one of 'cost', 'merge', 'windows', found 'cheap'"):
        EngineOptions(extreme_refill="cheap")  # in code too, not only from settings
    for table, found in (("[tool.laminar.engine]\nrefil_ratio = 0.25",
                          "engine: [tool.laminar.engine]: 'refil_ratio' is not an engine option; did you mean "
                          "'refill_ratio'? the options are refill_ratio"),
                         ("[tool.laminar.engine]\nrefill_ratio = 'lots'", "refill_ratio: Input should be a valid number"),
                         ("[tool.laminar.engine]\nrefill_ratio = -0.5", "refill_ratio: expected 0 or more (found -0.5)"),
                         ("[tool.laminar.engine]\nrefill_ratio = nan", "refill_ratio: expected a finite number"),
                         ("[tool.laminar.engine]\nrefill_ratio = true", "refill_ratio: expected float or none, found a boolean"),
                         ("[tool.laminar.engine]\nmetrics_partitions = 0", "metrics_partitions: expected 1 or more"),
                         ("[tool.laminar.engine]\npartitions_per_file = 0", "partitions_per_file: expected 1 or more"),
                         ("[tool.laminar.engine]\nlease_seconds = 0", "lease_seconds: expected more than 0 seconds"),
                         ("[tool.laminar.engine]\nextreme_refill = 'cheapest'",
                          "extreme_refill: Input should be 'cost', 'merge' or 'windows' (found 'cheapest')"),
                         ("[tool.laminar.engine]\nextreme_refill_share = 0.5", "'extreme_refill_share' is now extreme_refill"),
                         ("[tool.laminar.engine]\nscan_bytes_per_second = 0", "scan_bytes_per_second: expected more than 0"),
                         ("[tool.laminar.engine]\nfuture_horizon = '1d'", "future_horizon is set on [tool.laminar] itself"),
                         ("[tool.laminar.engin]\nrefill_ratio = 0.2",
                          "engin: not a setting (did you mean 'engine'? the settings: partitions_start"),
                         ("[tool.laminar]\nfuture_horizont = '2d'",
                          "future_horizont: not a setting (did you mean 'future_horizon'? "),
                         ("[tool.laminar]\nwatch = 1", "watch: not a setting (the settings: "),
                         ("[tool]\nlaminar = 1", "[tool.laminar] must be a table of settings, found 1")):
        path.write_text(f"{table}\n")
        with pytest.raises(EnvironmentProblem, match=re.escape(found)) as caught:
            load_settings(path)
        assert str(path) in caught.value.message and "\n" not in caught.value.message


def test_a_resources_engine_options_override_the_project_files():
    from laminar_assets.engine import EngineOptions

    settings = LaminarSettings(engine={"refill_ratio": 0.25, "metrics_partitions": 8})
    chosen = EngineOptions.of({**settings.engine_options(), **{"refill_ratio": None, "future_horizon": "2d"}})
    assert (chosen.refill_ratio, chosen.metrics_partitions, chosen.future_horizon) == (None, 8, timedelta(days=2))
    with pytest.raises(EnvironmentProblem, match="LaminarResource.engine_options: 'refill' is not an engine option"):
        EngineOptions.of({"refill": 1}, where="LaminarResource.engine_options")


def test_the_docs_list_every_engine_option():
    from dataclasses import fields
    from pathlib import Path

    from laminar_assets.engine import EngineOptions

    doc = (Path(__file__).resolve().parents[2] / "docs" / "dagster.md").read_text()
    section = doc[doc.index("## Engine options"):doc.index("## Alerts")]
    missing = [f.name for f in fields(EngineOptions) if f"`{f.name}`" not in section]
    assert not missing, f"docs/dagster.md, 'Engine options', does not name {missing}"
