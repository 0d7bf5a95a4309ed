"""The install's class archive: written by a JVM running Laminar's work, put in place only when a new
JVM maps it, and a clear message when it cannot be written."""

from __future__ import annotations

import os

import pytest

from laminar_assets.deploy import class_archive_writer
from laminar_assets.errors import EnvironmentProblem


@pytest.mark.spark
def test_archive_is_written_and_a_new_jvm_maps_it(tmp_path):
    path = str(tmp_path / "share" / "spark-classes.jsa")
    assert class_archive_writer.create(path) == path
    # create() started a JVM with -Xshare:on on it before moving it in place (that JVM refuses to
    # start on an archive it cannot map); a second check here, on the installed file
    class_archive_writer._python(["--check", path], 300, "mapping the installed archive")
    assert os.path.getsize(path) > 50 * 2**20
    assert [p.name for p in (tmp_path / "share").iterdir()] == ["spark-classes.jsa"]  # no partial left


def test_an_unwritable_place_gives_a_message_and_leaves_nothing(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(EnvironmentProblem, match="cannot create the folder of the class archive .*file/spark"):
        class_archive_writer.create(str(blocked / "spark-classes.jsa"))
    assert blocked.read_text() == "not a directory"


def test_a_failed_check_leaves_no_archive(tmp_path, monkeypatch):
    def fail(args, timeout, doing):
        raise EnvironmentProblem(f"{doing} failed (exit 1): boom")

    monkeypatch.setattr(class_archive_writer, "_python", fail)
    path = tmp_path / "spark-classes.jsa"
    with pytest.raises(EnvironmentProblem, match="writes the archive failed"):
        class_archive_writer.create(str(path))
    assert not path.exists() and list(tmp_path.iterdir()) == []
