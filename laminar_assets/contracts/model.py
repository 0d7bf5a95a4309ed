"""The contract file format (pydantic): columns, unique key, value expectations, blocking."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ContractColumn(BaseModel):
    """A column: its Spark SQL type name and whether nulls are allowed."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["string", "bigint", "int", "double", "float", "boolean", "timestamp", "date", "binary"]
    nullable: bool = True


class ExpectationRule(BaseModel):
    """One value expectation. `expect` picks the kind; the other fields are its arguments."""

    model_config = ConfigDict(extra="forbid")
    expect: Literal["not_null", "unique", "between", "in_set", "row_count_between", "match_regex"]
    column: str | None = None
    columns: list[str] | None = None
    min: float | None = None
    max: float | None = None
    strict_min: bool = False
    values: list[str | int | float] | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _arguments(self) -> ExpectationRule:
        needs_column = self.expect in ("not_null", "between", "in_set", "match_regex")
        if needs_column and not self.column:
            raise ValueError(f"'{self.expect}' needs 'column'")
        if self.expect == "unique" and not (self.column or self.columns):
            raise ValueError("'unique' needs 'column' or 'columns'")
        if self.expect in ("between", "row_count_between") and self.min is None and self.max is None:
            raise ValueError(f"'{self.expect}' needs 'min' and/or 'max'")
        if self.expect == "in_set" and not self.values:
            raise ValueError("'in_set' needs 'values'")
        if self.expect == "match_regex" and not self.regex:
            raise ValueError("'match_regex' needs 'regex'")
        return self

    def columns_used(self) -> list[str]:
        return [c for c in ([self.column] if self.column else []) + (self.columns or [])]

    def describe(self) -> str:
        cols = ",".join(self.columns_used()) or "table"
        args = {k: v for k, v in self.model_dump().items()
                if k not in ("expect", "column", "columns") and v is not None and not (k == "strict_min" and v is False)}
        return f"{self.expect}({cols}{', ' if args else ''}{', '.join(f'{k}={v}' for k, v in args.items())})"


class EventTimeRule(BaseModel):
    """Plausible event times `[not_before, before)`; rows outside (or without one) are quarantined."""

    model_config = ConfigDict(extra="forbid")
    column: str
    not_before: AwareDatetime
    before: AwareDatetime

    @model_validator(mode="after")
    def _ordered(self) -> EventTimeRule:
        if not self.not_before < self.before:
            raise ValueError(f"expected not_before < before, found {self.not_before} >= {self.before}")
        return self


class QuarantineRules(BaseModel):
    """Row rules of a source: rows breaking one are quarantined instead of aggregated.
    `rules` maps a rule name to a Spark SQL condition every good row meets (NULL counts as broken)."""

    model_config = ConfigDict(extra="forbid")
    event_time: EventTimeRule | None = None
    rules: dict[str, str] = Field(default_factory=dict)

    @field_validator("rules")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        from laminar_assets.engine import BUILTIN_RULES

        for name, check in value.items():
            if not _NAME.match(name) or name in BUILTIN_RULES:
                raise ValueError(f"rule name {name!r} must be an identifier other than {', '.join(BUILTIN_RULES)}")
            if not str(check).strip():
                raise ValueError(f"rule {name!r} needs a Spark SQL condition")
        return value


class Contract(BaseModel):
    """What one table (source, stage or sink) must look like."""

    model_config = ConfigDict(extra="forbid")
    table: str
    kind: Literal["source", "stage", "sink"]
    description: str = ""
    columns: dict[str, ContractColumn]
    unique_key: list[str] = Field(default_factory=list)
    expectations: list[ExpectationRule] = Field(default_factory=list)
    blocking: bool = False  # a failed check stops downstream materializations
    quarantine: QuarantineRules | None = None
    path: str = Field(default="", exclude=True)

    def rules(self) -> list[ExpectationRule]:
        """Every expectation, with the implied ones: declared non-null columns and the unique key."""
        implied = [ExpectationRule(expect="not_null", column=c) for c, spec in self.columns.items() if not spec.nullable]
        if self.unique_key:
            implied.append(ExpectationRule(expect="unique", columns=list(self.unique_key)))
        return implied + list(self.expectations)
