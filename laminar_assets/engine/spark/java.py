"""The Java that Spark would start: its version, and a clear error when it cannot run Spark."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from laminar_assets.errors import EnvironmentProblem

MIN_JAVA = 17


def java_version_output() -> str | None:
    """What `java -version` says for the `java` Spark would start (JAVA_HOME, else PATH), or None
    when there is none. Asked once per process and binary: every local session start needs it."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    real = os.path.realpath(java)
    return _version_output(real, os.path.getmtime(real))  # a JDK replaced in place has a new mtime


@functools.lru_cache(maxsize=8)
def _version_output(java: str, mtime: float) -> str | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stderr + out.stdout


def java_major_version() -> int | None:
    """The major version of the `java` Spark would start, or None if there is none."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', java_version_output() or "")
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java() -> None:
    """Raise a clear `EnvironmentProblem` unless Java 17+ is available."""
    major = java_major_version()
    if major is None:
        raise EnvironmentProblem(
            f"Spark needs Java {MIN_JAVA} or newer and no `java` was found: install a JDK/JRE "
            f"(e.g. `apt-get install openjdk-17-jre-headless` or `brew install openjdk@17`) "
            "and put it on PATH or set JAVA_HOME"
        )
    if major < MIN_JAVA:
        raise EnvironmentProblem(
            f"Spark needs Java {MIN_JAVA} or newer, found Java {major}: install Java {MIN_JAVA}+ "
            "and point JAVA_HOME at it"
        )
