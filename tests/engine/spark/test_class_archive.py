"""The class archive's name follows what the JVM checks: the pyspark jars and the Java build."""

from __future__ import annotations

import os

from pyspark.version import __version__

from laminar_assets.engine.spark import class_archive
from laminar_assets.engine.spark.java import java_major_version, java_version_output


def _fake_java(home, version: str, build: str, calls=None):
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    java = bin_dir / "java"
    record = f"echo run >> {calls}\n" if calls else ""
    java.write_text(f"#!/bin/sh\n{record}echo 'openjdk version \"{version}\" 2025-01-21' >&2\n"
                    f"echo 'OpenJDK Runtime Environment (build {build})' >&2\n")
    java.chmod(0o755)
    return java


def test_the_name_carries_pyspark_and_the_java_build(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "a"))
    _fake_java(tmp_path / "a", "17.0.9", "17.0.9+9-Debian-1")
    first = class_archive.archive_path(str(tmp_path / "venv"))
    name = os.path.basename(first)
    assert name.startswith(f"spark-{__version__}-java-17.0.9-") and name.endswith(".jsa"), name
    assert first.startswith(str(tmp_path / "venv" / "share" / "laminar"))
    # another build of the same version (a vendor's rebuild) is another archive
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "b"))
    _fake_java(tmp_path / "b", "17.0.9", "17.0.9+9-Debian-2")
    assert class_archive.archive_path(str(tmp_path / "venv")) != first
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "none"))
    assert class_archive.java_build() == "none"


def test_java_is_asked_once_per_binary_until_it_changes(monkeypatch, tmp_path):
    calls = tmp_path / "calls"
    java = _fake_java(tmp_path / "jdk", "21.0.2", "21.0.2+13", calls)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert java_major_version() == 21 and "21.0.2+13" in java_version_output()
    assert java_major_version() == 21
    assert calls.read_text().count("run") == 1
    _fake_java(tmp_path / "jdk", "21.0.3", "21.0.3+9", calls)  # the JDK updated in place
    os.utime(java, (1, 1))
    assert "21.0.3+9" in java_version_output()
    assert calls.read_text().count("run") == 2


def test_archives_of_other_builds_are_stale(tmp_path):
    current = tmp_path / f"spark-{__version__}-java-17.0.9-aaaaaaaa.jsa"
    for name in (current.name, "spark-4.0.0-java-17.0.9-aaaaaaaa.jsa", "spark-4.3.0-classes.jsa", "notes.txt",
                 f"{current.name}.123.partial"):
        (tmp_path / name).write_bytes(b"x")
    assert [os.path.basename(p) for p in class_archive.stale_archives(str(current))] == [
        "spark-4.0.0-java-17.0.9-aaaaaaaa.jsa", "spark-4.3.0-classes.jsa"]
    assert class_archive.stale_archives(str(tmp_path / "missing" / "x.jsa")) == []
