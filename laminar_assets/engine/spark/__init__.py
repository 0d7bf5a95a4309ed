"""Spark: building sessions (and the JVM class archive they map), the Java they need, reading file
lists, DataFrame helpers, literals that keep generated code stable, and queries as one SQL statement."""

from .class_archive import archive_path, dump_options, stale_archives
from .jars import GROUPS as JAR_GROUPS
from .jars import Jar, jar_dir
from .jars import installed as installed_jars
from .java import MIN_JAVA, check_java, java_major_version
from .metastore import check_metastore, metastore_env, postgres_metastore
from .session import (
    JIT_OPTIONS,
    SparkOptions,
    build_session,
    jvm_conf,
    metastore_conf,
    metastore_from_env,
    session_conf,
    start_session,
)

__all__ = [
    "archive_path", "build_session", "check_java", "dump_options", "installed_jars", "Jar", "jar_dir",
    "JAR_GROUPS", "java_major_version", "jvm_conf", "MIN_JAVA", "session_conf", "SparkOptions",
    "stale_archives", "start_session", "metastore_conf", "metastore_from_env", "check_metastore", "metastore_env",
    "postgres_metastore", "JIT_OPTIONS",
]
