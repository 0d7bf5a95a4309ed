"""A machine without Java gets a message that says what to install, not a Py4J trace."""

from __future__ import annotations

import pytest

from laminar_assets.engine import EnvironmentProblem, SparkOptions, check_java
from laminar_assets.engine.spark.session import JIT_OPTIONS


def test_missing_java_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(EnvironmentProblem, match=r"Java 17 or newer .* install a JDK/JRE"):
        check_java()


def test_old_java_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "jdk" / "bin"
    fake.mkdir(parents=True)
    java = fake / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(EnvironmentProblem, match="found Java 11"):
        check_java()


def test_spark_options_from_env(monkeypatch):
    monkeypatch.setenv("LAMINAR_SPARK_MASTER", "spark://cluster:7077")
    monkeypatch.delenv("LAMINAR_SPARK_REMOTE", raising=False)
    assert SparkOptions.from_env().master == "spark://cluster:7077"
    assert SparkOptions.from_env(master="local[1]").master == "local[1]"
    monkeypatch.setenv("LAMINAR_SPARK_REMOTE", "sc://connect:15002")
    assert SparkOptions.from_env().remote == "sc://connect:15002"


def test_local_python_workers_run_this_interpreter(monkeypatch):
    import sys

    from laminar_assets.engine.spark.session import jvm_conf

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert jvm_conf(SparkOptions())["spark.pyspark.python"] == sys.executable
    # a cluster's executors may not have this path: they take PYSPARK_PYTHON
    assert "spark.pyspark.python" not in jvm_conf(SparkOptions(master="spark://127.0.0.1:7077"))
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python3")
    assert "spark.pyspark.python" not in jvm_conf(SparkOptions())


def test_jvm_maps_the_class_archive_only_when_it_exists(monkeypatch, tmp_path):
    from laminar_assets.engine.spark import class_archive
    from laminar_assets.engine.spark.session import jvm_conf

    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(class_archive, "archive_path", lambda prefix=None: str(archive))
    assert "SharedArchiveFile" not in jvm_conf(SparkOptions())["spark.driver.extraJavaOptions"]
    archive.write_bytes(b"archive")
    options = jvm_conf(SparkOptions())["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in options and "log4j2.configurationFile" in options
    # a mismatched archive is ignored by the JVM; its warning would go to the session's stdout
    assert "-Xlog:cds=off" in options
    assert "SharedArchiveFile" not in jvm_conf(SparkOptions(class_sharing=False))["spark.driver.extraJavaOptions"]
    extra = jvm_conf(SparkOptions(class_sharing=False, java_options="-Xshare:on"))["spark.driver.extraJavaOptions"]
    assert extra.endswith(" -Xshare:on")


def test_the_demo_starts_the_session_its_runs_ask_for(monkeypatch):
    """`laminar demo` starts Spark with SparkOptions.from_env() before the definitions load; the runs'
    resource must ask for the same options, or the early session would be the wrong one."""
    from laminar_assets.resources import SparkResource

    monkeypatch.delenv("LAMINAR_SPARK_MASTER", raising=False)
    monkeypatch.delenv("LAMINAR_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("LAMINAR_SPARK_JIT", raising=False)
    assert SparkResource().options() == SparkOptions.from_env()
    assert SparkResource(stop_at_end=False).options() == SparkOptions.from_env()
    from laminar_assets.demo import DEMO_JIT

    assert SparkResource(jit=DEMO_JIT).options() == SparkOptions.from_env(jit=DEMO_JIT)


def test_jit_mode_of_a_jvm_laminar_starts(monkeypatch):
    from laminar_assets.engine.spark.session import jvm_conf

    monkeypatch.delenv("LAMINAR_SPARK_JIT", raising=False)
    default = jvm_conf(SparkOptions())["spark.driver.extraJavaOptions"]
    assert "TieredStopAtLevel" not in default and "Tier4" not in default  # "tiered": the JVM's own
    assert "-XX:Tier4InvocationThreshold=50000" in jvm_conf(SparkOptions(jit="hot"))["spark.driver.extraJavaOptions"]
    quick = jvm_conf(SparkOptions(jit="quick", java_options="-Xss4m"))["spark.driver.extraJavaOptions"]
    assert quick.endswith("-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -Xss4m")  # the user's own come last
    monkeypatch.setenv("LAMINAR_SPARK_JIT", "quick")
    assert SparkOptions.from_env().jit == "quick"
    with pytest.raises(EnvironmentProblem, match=r"jit must be one of hot, quick, tiered, got 'fast'.*field=jit"):
        SparkOptions(jit="fast")


@pytest.mark.parametrize("jit", sorted(JIT_OPTIONS))
def test_every_jit_mode_keeps_a_code_cache_spark_fits_in(jit):
    """A JVM started with a mode's options reserves tiered's 240 MB code cache: C1-only alone gets
    48 MB, which Spark filled in ~40 s of small passes, and a full cache turns the compiler off."""
    import os
    import shutil
    import subprocess

    check_java()
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    out = subprocess.run([java, *JIT_OPTIONS[jit].split(), "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True,
                         timeout=60).stdout
    reserved = next(int(line.split("=")[1].split()[0]) for line in out.splitlines()
                    if line.split()[1:2] == ["ReservedCodeCacheSize"])
    assert reserved >= 240 * 1024 * 1024, (jit, reserved)
