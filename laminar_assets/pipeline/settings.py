"""Project settings that shape the Dagster definitions, from `[tool.laminar]` in pyproject.toml.

`LaminarSettings` is the one declaration of these settings (name, type, default, description, check):
`LaminarComponent` makes its attributes of the same names from it, so a defs.yaml and a pyproject.toml
take the same settings, described and checked alike. Runtime settings (storage root, Spark master) are
resource config instead, so nothing here reads environment variables.
"""

from __future__ import annotations

import pathlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from laminar_assets.errors import EnvironmentProblem, did_you_mean

FUTURE_HORIZON = timedelta(days=1)  # the default of `future_horizon`
_RELATIVE = re.compile(r"^today(?:\s*-\s*(\d+)\s*days?)?$")


def resolve_start(value: datetime | str, now: datetime | None = None) -> datetime:
    """A partition start as a UTC datetime: an ISO date/datetime, or 'today' / 'today - N days' (UTC
    midnight, N days before `now`) for demos and sandboxes whose data is always recent."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip().lower()
    relative = _RELATIVE.match(text)
    if relative:
        today = (now or datetime.now(UTC)).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return today - timedelta(days=int(relative.group(1) or 0))
    try:
        return resolve_start(datetime.fromisoformat(value))
    except ValueError:
        raise ValueError(f"expected an ISO date like '2026-11-01' or 'today - 2 days', found {value!r}") from None


@dataclass(frozen=True)
class SettingsSource:
    """Where settings are written, in the words of their error messages: `engine` names the table of
    engine options there, `horizon` says where future_horizon goes instead. Passed as the validation
    context (`LaminarSettings.model_validate(..., context=...)`); none: a pyproject.toml's `[tool.laminar]`."""

    engine: str = "[tool.laminar.engine]"
    horizon: str = "set on [tool.laminar] itself, not in [tool.laminar.engine]"


PYPROJECT = SettingsSource()


class LaminarSettings(BaseModel):
    """Definition-time settings; defaults suit the demo. A key that is no setting is refused (a misspelt one would
    otherwise leave its default in place without a word).

    The single declaration of the project-wide settings: `[tool.laminar]` sets them for a project, and
    `LaminarComponent` has an attribute for each (`component.settings_attributes`), with these descriptions
    and checks. Descriptions therefore name no file. The engine is imported only when a value is checked, so
    `dg list components` does not pay for it."""

    model_config = ConfigDict(extra="forbid")

    partitions_start: datetime = Field(default=datetime(2024, 1, 1, tzinfo=UTC), description=(
        "First partition of every flow that sets no `start` of its own: an ISO date, or 'today - N days' "
        "(resolved when the definitions load; older partitions then leave the catalog, their data stays)."))
    future_horizon: timedelta = Field(default=FUTURE_HORIZON, description=(
        "How far past now a partition may start (a duration: '6h', '1d'). The sensor searches changed rows for dirty "
        "partitions from the flow's first partition to now + this, so a row dated 9999 costs nothing; runs refuse later "
        "partitions, and a run's sweep quarantines rows later than that as event_time_outside_partitions."))
    sensor_interval_seconds: int = Field(default=1, ge=1, description=(
        "The least time between two ticks of a Delta-version sensor (a Laminar instance's daemon looks every "
        "quarter second; Dagster's own, every 5 s)."))
    sensor_watch_seconds: float = Field(default=0.9, ge=0, le=30, description=(
        "How long a sensor tick that finds no new commit keeps watching its source tables for one before it "
        "skips: a commit seen meanwhile is requested by that same tick, instead of waiting for the next (0: "
        "skip at once). Near the sensor interval the next tick follows this one without a gap; a longer watch "
        "only makes each tick last that long (Dagster's daemon gives a tick at most 60 s)."))
    sensor_poll_seconds: float | None = Field(default=None, gt=0, description=(
        "How often a watching tick looks for a source's next commit file; each look is one request per source "
        "table on an object store. Unset: every 0.05 s on a local disk, every 0.25 s on an object store."))
    schedules: dict[str, str] = Field(default_factory=dict, description=(
        "Flow name -> cron schedule that brings its latest partition up to date."))
    retries: int = Field(default=2, ge=0, description="Retries of an asset step that failed for a transient reason "
                         "(a Delta commit conflict, a partition lease held, a lost Spark connection).")
    retry_delay_seconds: float = Field(default=10.0, ge=0, description=(
        "Wait before the first retry; Dagster's exponential backoff then waits 3 times as long before the second "
        "(10 s, then 30 s), 7 times before the third."))
    resume_seconds: float = Field(default=30.0, ge=0, description=(
        "When a sensor-launched run fails after its retries with an error a retry may fix (a store, database or "
        "Spark server down for longer than the retries wait), its partitions run again this long after it ended, "
        "the pause doubling with every failed attempt up to resume_max_seconds (0: never; they wait for a new "
        "commit, a refill or the stale_partitions sensor)."))
    resume_max_seconds: float = Field(default=600.0, gt=0, description=(
        "The longest pause before a failed run's partitions run again."))
    alert: str = Field(default="log", description="Where failed runs are reported: 'log', a webhook URL "
                       "(http:// or https://, a JSON POST), or 'package.module:function' called with the alert.")
    engine: dict[str, Any] = Field(default_factory=dict, description=(
        "Engine options by name for every run and check: any `EngineOptions` field (refill_ratio, "
        "key_refill_min_bytes, ...) but future_horizon, a setting of its own. A project's `[tool.laminar.engine]` "
        "is read by the CLI's runs too; a resource's `engine_options` override these."))

    @field_validator("engine")
    @classmethod
    def _engine(cls, value, info: ValidationInfo):
        from laminar_assets.engine import EngineOptions

        source = info.context if isinstance(info.context, SettingsSource) else PYPROJECT
        if "future_horizon" in value:
            raise ValueError(f"future_horizon is {source.horizon}")
        try:
            EngineOptions.of(value, where=source.engine)  # a name or a value it refuses: one line
        except EnvironmentProblem as exc:
            raise ValueError(exc.message) from None
        return dict(value)

    @classmethod
    def check(cls, name: str, value: Any, source: SettingsSource = PYPROJECT) -> None:
        """Check one setting as these settings check it (its type, bounds and validator), for a place that
        takes settings one at a time (a component's attributes): a ValueError with the message, the field
        being named by the caller."""
        try:
            cls.__pydantic_validator__.validate_assignment(cls.model_construct(), name, value, context=source)
        except ValidationError as exc:
            raise ValueError("; ".join(_message(e) for e in exc.errors())) from None

    def engine_options(self) -> dict[str, Any]:
        """The `EngineOptions` these settings decide, by name (what `LaminarResource.engine` and the CLI take)."""
        return {"future_horizon": self.future_horizon, **self.engine}

    @field_validator("resume_max_seconds")
    @classmethod
    def _resume_max(cls, value: float, info: ValidationInfo) -> float:
        first = info.data.get("resume_seconds")
        if first is not None and value < first:
            raise ValueError(f"expected at least resume_seconds ({first:g} s), found {value:g} s: every pause would be "
                             f"{value:g} s")
        return value

    @field_validator("alert")
    @classmethod
    def _alert(cls, value: str) -> str:
        """The target's form, so a wrong one fails where it is written, not when a run fails and the alert about
        it is lost (`orchestration/alerts.py` delivers it; a function is imported then, not here)."""
        module, _, function = value.partition(":")
        if value == "log" or value.startswith(("http://", "https://")) or (
                function and all(p.isidentifier() for p in module.split(".")) and function.isidentifier()):
            return value
        raise ValueError(f"expected 'log', a webhook URL (http:// or https://) or 'package.module:function', "
                         f"found {value!r}")

    @field_validator("partitions_start", mode="before")
    @classmethod
    def _start(cls, value):
        return resolve_start(value)

    @field_validator("future_horizon", mode="before")
    @classmethod
    def _horizon(cls, value):
        from laminar_assets.engine import parse_duration

        horizon = parse_duration(value)
        if horizon < timedelta(0):
            raise ValueError(f"expected a duration of 0 or more like '1d', found {value!r}")
        return horizon


def load_settings(path: str | pathlib.Path | None = None) -> LaminarSettings:
    """The settings of `[tool.laminar]` in `path`, or in the project's pyproject.toml (`project_file`);
    the defaults when there is none."""
    path = pathlib.Path(path) if path else project_file()
    if path is None or not path.exists():
        return LaminarSettings()
    table = _laminar_table(path) or {}
    if not isinstance(table, dict):
        raise EnvironmentProblem(f"{path}: [tool.laminar] must be a table of settings, found {table!r}", file=str(path))
    try:
        return LaminarSettings(**table)
    except ValidationError as exc:  # one line per wrong setting, naming the file and the key
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'tool.laminar'}: {_message(e)}" for e in exc.errors())
        raise EnvironmentProblem(f"{path} [tool.laminar]: {wrong}", file=str(path)) from None


def _message(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(str(error["loc"][-1]), LaminarSettings.model_fields) if error["loc"] else ""
        return f"not a setting ({hint}the settings: {', '.join(LaminarSettings.model_fields)})"
    return error["msg"].removeprefix("Value error, ")


def project_file(package: pathlib.Path | None = None, cwd: pathlib.Path | None = None) -> pathlib.Path | None:
    """The pyproject.toml whose `[tool.laminar]` configures this process: the checkout's, beside the package
    (`laminar_assets/`), when the package runs from a checkout (an editable install, `make install`); else,
    for an installed package (in site-packages, where no project file lies beside it), the nearest one with
    a `[tool.laminar]` table in the current directory or above it (where `dagster dev` and `laminar` run);
    None when there is none."""
    package = package or pathlib.Path(__file__).resolve().parents[1]
    beside = package.parent / "pyproject.toml"
    if beside.exists():
        return beside
    start = (cwd or pathlib.Path.cwd()).resolve()
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _laminar_table(candidate) is not None:
            return candidate
    return None


def _laminar_table(path: pathlib.Path) -> dict | None:
    """`[tool.laminar]` of a pyproject.toml; None when it has none."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise EnvironmentProblem(f"{path} is not valid TOML ({exc}): Laminar reads its [tool.laminar] settings "
                                 "there; fix the file", file=str(path)) from None
    return data.get("tool", {}).get("laminar")
