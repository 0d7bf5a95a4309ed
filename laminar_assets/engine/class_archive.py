"""Class-data sharing for Spark's JVM: an archive of the classes Laminar's own work loads.

A new Spark JVM spends most of its first ten seconds loading and verifying classes: on the 2-core
machine a local session took 6.1-6.2 s to start and its first query 3.3-3.5 s; with an archive of
the classes a Laminar run loads, 3.2-3.7 s and 1.4-1.8 s (JDK 17's dynamic CDS archive, measured).
`make install` writes the archive once per virtualenv (`python -m laminar_assets.deploy.class_archive`);
every Spark JVM Laminar starts (a local session, the Spark Connect server of `laminar serve`) maps
it when it is there. The JVM itself checks that the archive matches its own build and class path
and ignores it otherwise (silently: its warnings are turned off), so a stale archive (another JDK, a
new pyspark) costs the speed-up, never a failure.
"""

from __future__ import annotations

import os
import sys

SUFFIX = ".jsa"


def archive_path(prefix: str | None = None) -> str:
    """Where the archive of this interpreter's pyspark lives: `<venv>/share/laminar/`, named by the
    pyspark version (a new pyspark ships new jars, so it needs a new archive)."""
    from pyspark.version import __version__

    return os.path.join(prefix or sys.prefix, "share", "laminar", f"spark-{__version__}-classes{SUFFIX}")


# The JVM's own messages about a missing or mismatched archive would go to the session's stdout.
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def use_options(path: str | None = None) -> str:
    """JVM options that map the archive at `path` (default `archive_path()`); empty when there is none."""
    path = path or archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if os.path.isfile(path) else ""


def dump_options(path: str) -> str:
    """JVM options that write the classes the JVM loaded to an archive at `path` when it exits."""
    return f"-XX:ArchiveClassesAtExit={path} {QUIET}"
