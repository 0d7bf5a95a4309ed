"""The install's class archive: written by a JVM running Laminar's work, put in place only when a new
JVM maps it, and a clear message when it cannot be written."""

from __future__ import annotations

import os

import pytest

from laminar_assets.deploy import class_archive_writer
from laminar_assets.engine.spark import archive_path
from laminar_assets.errors import EnvironmentProblem


@pytest.mark.spark
def test_the_installed_archive_maps_in_a_new_jvm():
    """`make test` runs `make class-archive` first, which writes this install's archive through `create`:
    a JVM running Laminar's work dumps it as it exits, and a second JVM must map it before it is moved in
    place. Writing a second archive here cost the suite about 100 s for the same path, so this checks the
    one the install wrote, and writes it only where it is missing (pytest run without make). A broken
    `create` still fails here: the install then leaves no archive (it only warns) and `main` fails."""
    path = archive_path()
    if not os.path.isfile(path):
        assert class_archive_writer.main([]) == 0, "the class archive could not be written (see stderr)"
    class_archive_writer._python(["--check", path], 300, "mapping the installed archive")
    assert os.path.getsize(path) > 50 * 2**20
    folder = os.path.dirname(path)
    assert not [n for n in os.listdir(folder) if n.endswith(".partial")], f"a partial archive left in {folder}"


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
