"""A source whose Delta log is damaged (a commit entry cut short, the checkpoint `_last_checkpoint` names
gone) fails with one line naming the table, the version and the file: `deltalake` names neither, and its
message carried a 13-line native backtrace of `<unknown>` frames."""

from __future__ import annotations

import glob
import os

import pytest

from laminar_assets.engine import SourceError
from laminar_assets.engine.delta import source_history, table_info
from laminar_assets.engine.delta.tables import read_commit
from laminar_assets.engine.report import new_commits


@pytest.fixture
def source(lake):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    lake.append("trades", [("2024-01-01 00:02:00", "a", 2.0, 1)])
    lake.append("trades", [("2024-01-01 00:03:00", "a", 3.0, 1)])
    return lake.path("trades")


def entry(uri: str, version: int) -> str:
    return os.path.join(uri, "_delta_log", f"{version:020d}.json")


def truncate(path: str) -> None:
    text = open(path).read()
    with open(path, "w") as fh:
        fh.write(text[: len(text) // 2])


def one_line_naming(exc: SourceError, version: int, file: str) -> None:
    assert exc.facts == {"table": "trades", "version": version, "file": file}, exc.facts
    assert "\n" not in str(exc) and "<unknown>" not in str(exc), str(exc)


@pytest.mark.parametrize("version", [1, 2])
def test_a_truncated_commit_entry_names_table_version_and_file(lake, source, version):
    truncate(entry(source, version))
    for read in (lambda: table_info("trades", source), lambda: source_history("trades", source, 0, 2, "ts"),
                 lambda: new_commits(lake.root, "trades", "ts", 0)):
        with pytest.raises(SourceError, match=f"the entry of commit {version} is not valid JSON") as info:
            read()
        one_line_naming(info.value, version, entry(source, version))


def test_a_truncated_entry_read_by_itself_names_table_version_and_file(source):
    """An entry older than the snapshot a reader opens (a checkpoint covers it) is read by Laminar alone."""
    truncate(entry(source, 1))
    with pytest.raises(SourceError, match="the entry of commit 1 is not valid JSON at line") as info:
        read_commit("trades", source, 1, "ts")
    one_line_naming(info.value, 1, entry(source, 1))


def test_a_missing_checkpoint_names_table_version_and_file(lake, source):
    lake.table("trades").create_checkpoint()
    [checkpoint] = glob.glob(os.path.join(source, "_delta_log", "*.checkpoint.parquet"))
    os.remove(checkpoint)
    with pytest.raises(SourceError, match="_last_checkpoint names the checkpoint of version 2, whose file is missing") as info:
        table_info("trades", source)
    one_line_naming(info.value, 2, checkpoint)
