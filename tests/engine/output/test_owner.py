"""Whose table a run may write (`output.owner`), on real Delta tables written by deltalake: no Spark."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from laminar_assets.engine import SpecError
from laminar_assets.engine.output.commit import ensure_table
from laminar_assets.engine.output.owner import OWNER_PROPERTY, check_owner

ROWS = pa.table({"window_start": pa.array([0], pa.timestamp("us", tz="UTC")), "n": pa.array([1], pa.int64())})


def test_a_missing_table_or_a_folder_of_laminars_own_uncommitted_files_may_be_written(tmp_path):
    assert check_owner(str(tmp_path / "t"), "f") is None
    uncommitted = tmp_path / "t" / "laminar" / "run1-ab12"  # a first run stopped before its first commit
    uncommitted.mkdir(parents=True)
    (uncommitted / "part-0.parquet").write_bytes(b"x")
    assert check_owner(str(tmp_path / "t"), "f") is None


def test_a_folder_holding_other_files_is_refused_naming_one(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "export.csv").write_text("a,b\n")
    with pytest.raises(SpecError, match=r"flow 'f' would write its sink into .*t, but that is a folder that is not a "
                                        r"Delta table and holds other files \(e.g. export.csv\)"):
        check_owner(str(tmp_path / "t"), "f")


def test_a_table_laminar_creates_names_its_flow_and_only_that_flow_may_write_it(tmp_path):
    uri = str(tmp_path / "t")
    ensure_table(uri, ROWS.schema, reset_on_schema_change=False, owner="f")
    assert DeltaTable(uri).metadata().configuration[OWNER_PROPERTY] == "f"
    assert check_owner(uri, "f") is not None
    with pytest.raises(SpecError, match=r"flow 'g' would write .* created by flow 'f' \(table property laminar.flow\)"):
        ensure_table(uri, ROWS.schema, reset_on_schema_change=False, owner="g")
    assert DeltaTable(uri).version() == 0  # nothing written by the refused call


def test_a_table_nobody_in_laminar_created_is_refused_and_left_as_it_is(tmp_path):
    uri = str(tmp_path / "symbols")
    write_deltalake(uri, ROWS)
    with pytest.raises(SpecError, match=r"a Delta table Laminar did not create \(version 0"):
        ensure_table(uri, ROWS.schema, reset_on_schema_change=True, owner="f")
    assert DeltaTable(uri).version() == 0 and OWNER_PROPERTY not in DeltaTable(uri).metadata().configuration


@pytest.mark.parametrize("evidence", ["commit_info", "app_transaction"])
def test_a_table_an_earlier_laminar_created_is_recognised_by_its_commits_and_stamped(tmp_path, evidence):
    """Tables written before the property existed carry the flow's commit info (`laminar.flow`) and its
    app transactions (`laminar/<flow>/<partition>`): either is enough, and the next commit stamps it."""
    uri = str(tmp_path / "t")
    props = (CommitProperties(custom_metadata={"laminar.flow": "f", "laminar.run_id": "r1"})
             if evidence == "commit_info" else
             CommitProperties(app_transactions=[Transaction("laminar/f/2024-01-01-00:00", 1)]))
    write_deltalake(uri, ROWS, commit_properties=props)
    write_deltalake(uri, ROWS, mode="append")  # a commit of no flow (e.g. a schema change) on top
    apps = ["laminar/f/2024-01-01-00:00"] if evidence == "app_transaction" else []
    assert check_owner(uri, "f", apps=apps) is not None
    with pytest.raises(SpecError):
        check_owner(uri, "g", apps=["laminar/g/2024-01-01-00:00"])
    ensure_table(uri, ROWS.schema, reset_on_schema_change=False, owner="f", apps=apps)
    assert DeltaTable(uri).metadata().configuration[OWNER_PROPERTY] == "f"
    assert check_owner(uri, "f") is not None  # the property alone now
    assert len(DeltaTable(uri).to_pyarrow_table()) == 2  # its rows untouched
    assert os.path.isdir(os.path.join(uri, "_delta_log"))
