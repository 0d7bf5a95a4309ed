"""The demo deletes only a lake it made: a root holding anything else is refused, nothing deleted."""

from __future__ import annotations

import os

import pytest

from laminar_assets import storage
from laminar_assets.demo.lake import MARKER, check_demo_root, reset_demo_lake
from laminar_assets.errors import LaminarError


def test_a_missing_or_empty_root_becomes_a_demo_lake_marked_first(tmp_path):
    for root in (tmp_path / "new" / "lake", tmp_path / "empty"):
        if root.name == "empty":
            (root / "sub").mkdir(parents=True)  # folders without files hold nothing
        reset_demo_lake(str(root))
        assert (root / MARKER).is_file()
        assert check_demo_root(str(root)) is True


def test_a_lake_the_demo_made_is_emptied_and_marked_again(tmp_path):
    root = str(tmp_path / "lake")
    reset_demo_lake(root)
    (tmp_path / "lake" / "raw_trades").mkdir()
    (tmp_path / "lake" / "raw_trades" / "part-0.parquet").write_bytes(b"x")
    reset_demo_lake(root)
    assert [os.path.relpath(f, root) for f, _ in storage.list_files(root)] == [MARKER]


def test_a_root_holding_other_files_is_refused_naming_root_and_files_and_nothing_is_deleted(tmp_path):
    root = tmp_path / "real"
    (root / "orders" / "_delta_log").mkdir(parents=True)
    (root / "orders" / "_delta_log" / "00000000000000000000.json").write_text("{}")
    with pytest.raises(LaminarError) as info:
        reset_demo_lake(str(root))
    text = str(info.value)
    assert str(root) in text and "orders/_delta_log/00000000000000000000.json" in text and MARKER in text, text
    assert "nothing was deleted" in text
    assert (root / "orders" / "_delta_log" / "00000000000000000000.json").read_text() == "{}"
    assert not (root / "_laminar").exists()


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("keep me")
    with pytest.raises(LaminarError, match="is a file, not a folder"):
        reset_demo_lake(str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "keep me"


def test_in_a_bucket_only_a_demo_prefix_is_emptied(s3_lake):
    """S3 lists keys (no folders): the same rules, through the object-store listing."""
    lake, other = storage.join(s3_lake.root, "lake"), storage.join(s3_lake.root, "data")
    storage.write(storage.join(other, "orders", "part-0.parquet"), b"x")
    with pytest.raises(LaminarError, match=r"holds files the demo did not make \(orders/part-0.parquet\)"):
        reset_demo_lake(other)
    assert storage.read(storage.join(other, "orders", "part-0.parquet")) == b"x"
    reset_demo_lake(lake)  # a new prefix
    storage.write(storage.join(lake, "raw_trades", "part-0.parquet"), b"y")
    reset_demo_lake(lake)
    assert [f for f, _ in storage.list_files(lake)] == [storage.join(lake, *MARKER.split("/"))]
    assert storage.read(storage.join(other, "orders", "part-0.parquet")) == b"x"


@pytest.mark.parametrize("args", [["demo", "--rows", "50"], ["check", "--demo", "--rows", "50"]])
def test_the_demo_commands_refuse_a_real_lake_before_spark_starts(tmp_path, args):
    from typer.testing import CliRunner

    from laminar_assets.cli import app

    root = tmp_path / "lake"
    (root / "orders").mkdir(parents=True)
    (root / "orders" / "data.parquet").write_bytes(b"x")
    result = CliRunner().invoke(app, ["--root", str(root), *args], env={"DAGSTER_HOME": str(tmp_path / "dh")})
    assert isinstance(result.exception, LaminarError), result.output
    assert "orders/data.parquet" in str(result.exception) and "nothing was deleted" in str(result.exception)
    assert (root / "orders" / "data.parquet").read_bytes() == b"x"
    assert sorted(os.listdir(root)) == ["orders"]
