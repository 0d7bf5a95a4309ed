"""Great Expectations glue: a contract becomes an expectation suite, run on a Spark DataFrame."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache

from .model import Contract, ExpectationRule


@dataclass(frozen=True)
class Failure:
    expectation: str
    unexpected_count: int | None
    examples: list = field(default_factory=list)
    observed: object = None


@dataclass(frozen=True)
class ValidationSummary:
    success: bool
    evaluated: int
    failures: tuple[Failure, ...]

    def to_json(self) -> dict:
        return {"success": self.success, "evaluated": self.evaluated,
                "failures": [f.__dict__ for f in self.failures]}


_CONTEXT_LOCK = threading.Lock()
_warming: list[threading.Thread] = []


def _context():
    with _CONTEXT_LOCK:  # the warm-up thread and a check may ask at the same time: build it once
        return _new_context()


def warm_up() -> threading.Thread | None:
    """Import Great Expectations and build its context in a background thread, once per process.

    A daemon-launched run is a new process and importing great_expectations takes seconds; an asset
    whose contract check follows it (a blocking one is on the path to every downstream flow) starts
    this first, so the import overlaps with the asset's own Spark work instead of following it.
    Returns the thread it started, or None when an earlier call started one."""
    if _warming:
        return None
    thread = threading.Thread(target=_warm, name="laminar-gx-warm-up", daemon=True)
    _warming.append(thread)
    thread.start()
    return thread


def _warm() -> None:
    try:
        _context()
    except Exception:  # noqa: BLE001 - the check itself calls _context() again and reports the error
        return


@lru_cache(maxsize=1)
def _new_context():
    import logging
    import os

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # before the import: no usage statistics calls
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return ctx


def _expectation(rule: ExpectationRule):
    import great_expectations as gx

    e = gx.expectations
    if rule.expect == "not_null":
        return e.ExpectColumnValuesToNotBeNull(column=rule.column)
    if rule.expect == "unique":
        cols = rule.columns_used()
        return e.ExpectColumnValuesToBeUnique(column=cols[0]) if len(cols) == 1 else \
            e.ExpectCompoundColumnsToBeUnique(column_list=cols)
    if rule.expect == "between":
        return e.ExpectColumnValuesToBeBetween(column=rule.column, min_value=rule.min, max_value=rule.max,
                                               strict_min=rule.strict_min)
    if rule.expect == "in_set":
        return e.ExpectColumnValuesToBeInSet(column=rule.column, value_set=list(rule.values or []))
    if rule.expect == "row_count_between":
        return e.ExpectTableRowCountToBeBetween(min_value=rule.min, max_value=rule.max)
    if rule.expect == "match_regex":
        return e.ExpectColumnValuesToMatchRegex(column=rule.column, regex=rule.regex)
    raise ValueError(rule.expect)


def expectation_suite(contract: Contract):
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=f"laminar.{contract.table}")
    for rule in contract.rules():
        suite.add_expectation(_expectation(rule))
    return suite


def validate(df, contract: Contract, *, name: str = "partition") -> ValidationSummary:
    """Run the contract's suite on a Spark DataFrame with Great Expectations' Spark data source."""
    ctx = _context()
    source_name = "laminar_spark"
    try:
        source = ctx.data_sources.get(source_name)
    except (KeyError, ValueError, Exception):
        source = ctx.data_sources.add_spark(name=source_name)
    asset_name = f"{contract.table}_{name}"
    try:
        asset = source.get_asset(asset_name)
    except (LookupError, Exception):
        asset = source.add_dataframe_asset(name=asset_name)
    try:
        batch_def = asset.get_batch_definition("whole")
    except (KeyError, Exception):
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    rules = contract.rules()
    result = batch.validate(expectation_suite(contract), result_format={"result_format": "SUMMARY",
                                                                        "partial_unexpected_count": 5})
    failures = []
    for rule, r in zip(rules, result.results):
        if not r.success:
            res = r.result or {}
            failures.append(Failure(rule.describe(), res.get("unexpected_count"),
                                    [_plain(v) for v in (res.get("partial_unexpected_list") or [])][:5],
                                    _plain(res.get("observed_value"))))
    return ValidationSummary(bool(result.success), len(rules), tuple(failures))


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
