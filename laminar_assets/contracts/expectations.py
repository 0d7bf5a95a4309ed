"""Great Expectations glue: a contract becomes an expectation suite, run on a run's output DataFrame."""

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
    engine: str = "spark"     # which GE execution engine checked the rows
    rows: int | None = None   # rows checked (counted before choosing the engine)

    def to_json(self) -> dict:
        return {"success": self.success, "evaluated": self.evaluated, "engine": self.engine, "rows": self.rows,
                "failures": [f.__dict__ for f in self.failures]}


_CONTEXT_LOCK = threading.Lock()
# The GE context is one per process and not thread-safe: a run's contract checks run in threads at
# once (thread_executor), and two adding their data assets at the same time lose one of them.
_VALIDATION_LOCK = threading.Lock()
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
        assert rule.column is not None, rule  # ExpectationRule._arguments: this kind needs a column
        return e.ExpectColumnValuesToNotBeNull(column=rule.column)
    if rule.expect == "unique":
        cols = rule.columns_used()
        return e.ExpectColumnValuesToBeUnique(column=cols[0]) if len(cols) == 1 else \
            e.ExpectCompoundColumnsToBeUnique(column_list=cols)
    if rule.expect == "between":
        assert rule.column is not None, rule  # ExpectationRule._arguments: this kind needs a column
        return e.ExpectColumnValuesToBeBetween(column=rule.column, min_value=rule.min, max_value=rule.max,
                                               strict_min=rule.strict_min)
    if rule.expect == "in_set":
        assert rule.column is not None, rule  # ExpectationRule._arguments: this kind needs a column
        return e.ExpectColumnValuesToBeInSet(column=rule.column, value_set=list(rule.values or []))
    if rule.expect == "row_count_between":
        # GE types the bounds as whole counts; a rule's bounds are floats, passed on as the rule holds them
        return e.ExpectTableRowCountToBeBetween(min_value=rule.min, max_value=rule.max)  # type: ignore[arg-type]
    if rule.expect == "match_regex":
        assert rule.column is not None and rule.regex is not None, rule  # ExpectationRule._arguments
        return e.ExpectColumnValuesToMatchRegex(column=rule.column, regex=rule.regex)
    raise ValueError(rule.expect)


RULE_KEY = "laminar_rule"


def expectation_suite(contract: Contract):
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=f"laminar.{contract.table}")
    for i, rule in enumerate(contract.rules()):
        expectation = _expectation(rule)
        expectation.meta = {RULE_KEY: i}  # GE may report results in another order than the suite's
        suite.add_expectation(expectation)
    return suite


LOCAL_ROWS = 100_000
"""Partitions up to this many rows are validated with Great Expectations' pandas engine: GE's
Spark engine runs several Spark jobs per expectation (docs/PERFORMANCE.md), and a run's blocking
contract sits on the path to every
downstream flow. Larger outputs are validated in Spark, so the driver never holds more than this."""


def validate(df, contract: Contract, *, name: str = "partition", local_rows: int = LOCAL_ROWS) -> ValidationSummary:
    """Run the contract's suite on a Spark DataFrame (one of a run's outputs, never a source table).

    At most `local_rows` rows: the rows come to the driver as pandas and GE's pandas engine checks
    them; more: GE's Spark data source checks them where they are. The answer is the same (one
    difference: pandas counts a floating-point NaN as null, Spark does not)."""
    local = fetch_local(df, local_rows)
    if local is not None:
        return validate_local(local, contract, name=name)
    rows = df.count()
    with _VALIDATION_LOCK:
        batch = _batch("laminar_spark", f"{contract.table}_{name}", df, pandas=False)
        return _summary(batch, contract, engine="spark", rows=rows)


def fetch_local(df, local_rows: int = LOCAL_ROWS):
    """`df`'s rows as pandas when there are at most `local_rows`, else None; one Spark job (it fetches
    up to one row more than the limit)."""
    if local_rows <= 0:
        return None
    local = df.limit(local_rows + 1).toPandas()
    return local if len(local) <= local_rows else None


_NON_NULL_DTYPES = {"ByteType": "int8", "ShortType": "int16", "IntegerType": "int32", "LongType": "int64",
                    "BooleanType": "bool"}


def local_slice(frame, mask, schema):
    """Rows `mask` of a frame `fetch_local` returned, typed as a fetch of those rows alone would be:
    pandas widens an integer column to float64 (a boolean one to object) only when the fetched rows
    hold a null, and a widened column would check differently (a regex sees "5.0", not "5")."""
    part = frame[mask].reset_index(drop=True)
    for f in schema.fields:
        dtype = _NON_NULL_DTYPES.get(type(f.dataType).__name__)
        if dtype and f.name in part.columns and str(part[f.name].dtype) != dtype and not part[f.name].isna().any():
            part[f.name] = part[f.name].astype(dtype)
    return part


def validate_local(frame, contract: Contract, *, name: str = "partition") -> ValidationSummary:
    """Run the contract's suite on rows already fetched as pandas (GE's pandas engine, no Spark job)."""
    with _VALIDATION_LOCK:
        batch = _batch("laminar_pandas", f"{contract.table}_{name}", frame, pandas=True)
        return _summary(batch, contract, engine="pandas", rows=len(frame))


def _summary(batch, contract: Contract, *, engine: str, rows: int) -> ValidationSummary:
    rules = contract.rules()
    result = batch.validate(expectation_suite(contract), result_format={"result_format": "SUMMARY",
                                                                        "partial_unexpected_count": 5})
    failures = []
    for r in result.results:
        rule = rules[int(r.expectation_config.meta[RULE_KEY])]
        if not r.success:
            res = r.result or {}
            failures.append(Failure(rule.describe(), res.get("unexpected_count"),
                                    [_plain(v) for v in (res.get("partial_unexpected_list") or [])][:5],
                                    _plain(res.get("observed_value"))))
    return ValidationSummary(bool(result.success), len(rules), tuple(failures), engine=engine, rows=rows)


def _batch(source_name: str, asset_name: str, frame, *, pandas: bool):
    """A GE batch over `frame`; the data source, asset and batch definition are made once per process."""
    ctx = _context()
    try:
        source = ctx.data_sources.get(source_name)
    except KeyError:
        source = ctx.data_sources.add_pandas(name=source_name) if pandas else ctx.data_sources.add_spark(name=source_name)
    try:
        asset = source.get_asset(asset_name)
    except LookupError:
        asset = source.add_dataframe_asset(name=asset_name)
    try:
        batch_def = asset.get_batch_definition("whole")
    except KeyError:
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    return batch_def.get_batch(batch_parameters={"dataframe": frame})


def _plain(value):
    """JSON-ready and engine-neutral: a pandas Timestamp and a datetime both print as '2024-01-02 09:00:00'."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
