"""Class-data sharing for Spark's JVM: an archive of the classes Laminar's own work loads.

A new Spark JVM spends most of its first seconds loading and verifying classes; with an archive of
the classes a Laminar run loads (JDK 17's dynamic CDS archive) a session starts and answers its
first query about twice as fast (docs/PERFORMANCE.md).
`make install` writes the archive once per virtualenv (`python -m laminar_assets.deploy.class_archive_writer`);
every Spark JVM Laminar starts (a local session, the Spark Connect server of `laminar serve`) maps
it when it is there. The JVM itself checks that the archive matches its own build and class path
and ignores it otherwise (silently: its warnings are turned off), so a stale archive (another JDK, a
new pyspark) costs the speed-up, never a failure.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

from .java import java_version_output

SUFFIX = ".jsa"


def archive_path(prefix: str | None = None) -> str:
    """Where the archive of this interpreter's pyspark and this machine's Java lives:
    `<venv>/share/laminar/`, named by the pyspark version (a new pyspark ships new jars) and the Java
    build (a JDK update ignores an archive another build wrote), so either change asks for a new one."""
    from pyspark.version import __version__

    return os.path.join(prefix or sys.prefix, "share", "laminar", f"spark-{__version__}-java-{java_build()}{SUFFIX}")


def java_build() -> str:
    """The Java version and a digest of `java -version`'s whole text (vendor and build), e.g. `17.0.9-1a2b3c4d`."""
    out = java_version_output()
    if out is None:
        return "none"
    match = re.search(r'version "([^"]+)"', out)
    version = re.sub(r"[^A-Za-z0-9._-]", "_", match.group(1)) if match else "unknown"
    return f"{version}-{hashlib.sha256(out.encode()).hexdigest()[:8]}"


def stale_archives(path: str) -> list[str]:
    """Archives beside `path` that other pyspark or Java builds wrote (the JVM would ignore them)."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
            if n.startswith("spark-") and n.endswith(SUFFIX) and os.path.join(folder, n) != path]


# The JVM's own messages about a missing or mismatched archive would go to the session's stdout.
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def use_options(path: str | None = None) -> str:
    """JVM options that map the archive at `path` (default `archive_path()`); empty when there is none."""
    path = path or archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if os.path.isfile(path) else ""


def dump_options(path: str) -> str:
    """JVM options that write the classes the JVM loaded to an archive at `path` when it exits."""
    return f"-XX:ArchiveClassesAtExit={path} {QUIET}"
