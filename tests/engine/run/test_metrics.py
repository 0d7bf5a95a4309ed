"""`RunMetrics`: the one list of run metrics, read by name like the dict it replaced, and refusing names that
are no metric wherever they are read or written."""

from __future__ import annotations

import json

import pytest

from laminar_assets.engine import RunMetrics
from laminar_assets.engine.report.system_tables import METRICS as SYSTEM_TABLE_METRICS


def test_metrics_read_by_name_and_unmeasured_ones_are_absent():
    m = RunMetrics.of({"rows_read": 3, "sink_rows": 0}, refilled_share=0.25)
    assert m.rows_read == 3 and m["sink_rows"] == 0 and m.get("files_read", 7) == 7
    assert "rows_read" in m and "files_read" not in m and len(m) == 3
    assert m.as_dict() == {"rows_read": 3, "sink_rows": 0, "refilled_share": 0.25}
    assert json.loads(json.dumps(m.as_dict())) == dict(m.items())
    with pytest.raises(KeyError, match="not measured"):
        m["files_read"]
    m.update(files_read=2, rows_read=None)  # None: not measured
    assert m.as_dict() == {"files_read": 2, "sink_rows": 0, "refilled_share": 0.25}


@pytest.mark.parametrize("use", [lambda m: m.__setitem__("rows_red", 1), lambda m: m["rows_red"],
                                 lambda m: m.get("rows_red", 0), lambda m: m.update(rows_red=1),
                                 lambda m: RunMetrics.of({"rows_red": 1}), lambda m: "rows_red" in m])
def test_a_name_that_is_no_metric_is_refused_where_it_is_used(use):
    with pytest.raises(KeyError, match="'rows_red' is not a run metric .*rows_read"):
        use(RunMetrics())
    with pytest.raises(AttributeError):
        RunMetrics().rows_red = 1  # slots: no attribute beside the metrics


@pytest.mark.parametrize("name, value, error", [("rows_read", "lots", TypeError), ("rows_read", 1.7, TypeError),
                                                ("rows_read", True, TypeError), ("rows_read", -5, ValueError),
                                                ("refilled_share", float("nan"), ValueError),
                                                ("refilled_share", float("inf"), ValueError)])
def test_a_value_that_is_no_count_or_share_is_refused_where_it_is_written(name, value, error):
    m = RunMetrics(rows_read=1)
    for write in (lambda: setattr(m, name, value), lambda: m.__setitem__(name, value),
                  lambda: m.update({"sink_rows": 4, name: value}), lambda: RunMetrics(**{name: value})):
        with pytest.raises(error, match=f"run metric '{name}'"):
            write()
    assert m.as_dict() == {"rows_read": 1}  # an update that failed set nothing


def test_numbers_from_numpy_and_arrow_become_pythons():
    import numpy as np

    m = RunMetrics(rows_read=np.int64(3), refilled_share=np.float32(0.5))
    assert type(m.rows_read) is int and type(m.refilled_share) is float
    assert m.items() == list(m.items()) == [("rows_read", 3), ("refilled_share", 0.5)] and m.values() == [3, 0.5]


def test_shown_values_have_their_fields_types_and_name_only_metrics():
    m = RunMetrics.of(refilled_share=0, rows_read=4, partial_groups=9)
    assert m.shown_values() == {"refilled_share": 0.0, "rows_read": 4}  # partial_groups is not shown
    assert type(m.shown_values()["refilled_share"]) is float and type(m.shown_values()["rows_read"]) is int
    assert set(RunMetrics.shown) <= set(RunMetrics.names())
    assert set(SYSTEM_TABLE_METRICS) <= set(RunMetrics.names())  # laminar_system.runs' columns are run metrics
