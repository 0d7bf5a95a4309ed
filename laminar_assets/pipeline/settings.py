"""Project settings that shape the Dagster definitions, from `[tool.laminar]` in pyproject.toml.

Runtime settings (storage root, Spark master) are resource config instead, so
nothing here reads environment variables.
"""

from __future__ import annotations

import pathlib
import tomllib
from datetime import datetime

from pydantic import BaseModel, Field


class LaminarSettings(BaseModel):
    """Definition-time settings; defaults suit the demo."""

    partitions_start: datetime = Field(default=datetime(2024, 1, 1), description="First partition of every flow.")
    sensor_interval_seconds: int = Field(default=1, ge=1, description=(
        "The least time between two ticks of a Delta-version sensor (Dagster's daemon evaluates sensors at most "
        "once every 5 s)."))
    schedules: dict[str, str] = Field(default_factory=dict, description="Flow name -> cron schedule of its latest partition.")
    retries: int = Field(default=2, ge=0, description="Retries of an asset step that failed for a transient reason "
                         "(a Delta commit conflict, a partition lease held, a lost Spark connection).")
    retry_delay_seconds: float = Field(default=10.0, ge=0, description="Wait before the first retry; doubles after.")
    alert: str = Field(default="log", description="Where failed runs are reported: 'log', a webhook URL "
                       "(http:// or https://, a JSON POST), or 'package.module:function' called with the alert.")


def load_settings(path: str | pathlib.Path | None = None) -> LaminarSettings:
    path = pathlib.Path(path) if path else pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not path.exists():
        return LaminarSettings()
    data = tomllib.loads(path.read_text()).get("tool", {}).get("laminar", {})
    return LaminarSettings(**data)
