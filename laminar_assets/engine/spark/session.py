"""Building the SparkSession Laminar runs on, after checking the machine can run one."""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field

from laminar_assets import storage
from laminar_assets.errors import EnvironmentProblem

from . import class_archive, jars
from .java import MIN_JAVA, check_java, java_major_version  # noqa: F401  (re-exported: the engine's API)
from .metastore import check_metastore, postgres_conf, postgres_metastore

# How a JVM Laminar starts compiles hot code (SparkOptions.jit).
JIT_OPTIONS = {
    # C1 at once, C2 only for the hottest code: about 10x the JVM's invocation thresholds for the
    # optimizing compiler (loops over rows still reach it through back-edge counts). Spark's
    # planner is a large body of lukewarm code that C2 kept compiling for minutes. Planner code that
    # many small runs call stays in C1 longer, though: opt-in (docs/deploying.md, "Spark").
    "hot": "-XX:Tier4InvocationThreshold=50000 -XX:Tier4CompileThreshold=60000 -XX:Tier4MinInvocationThreshold=20000",
    "tiered": "",  # the JVM's default: C1 at once, C2 later for any warm code
    # C1 only. Without tiers the JVM reserves a 48 MB code cache, not tiered's 240 MB: Spark's code
    # fills it within a short run, and a full cache disables the compiler for the JVM's life
    # ("CodeCache is full. Compiler has been disabled").
    "quick": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m",
}


@dataclass(frozen=True)
class SparkOptions:
    """Where Spark runs. `master` for a cluster, `remote` for a Spark Connect endpoint."""

    master: str = "local[*]"
    remote: str | None = None
    app_name: str = "laminar"
    shuffle_partitions: int = 4
    driver_memory: str = "2g"
    log_level: str = "FATAL"  # Spark's own console logging; Laminar reports failures itself
    conf: dict[str, str] = field(default_factory=dict, hash=False)
    # Map the install's class archive (class_archive.py) into a JVM Laminar starts; False: start without it.
    class_sharing: bool = True
    java_options: str = ""  # more options for a JVM Laminar starts (the local driver, a Connect server)
    # "tiered" (the JVM's default), "hot" (C2 only for the hottest code) or "quick" (C1 only). A
    # short-lived JVM on few cores spends most of its CPU in the C2 compiler (docs/PERFORMANCE.md), so
    # "quick" is for the demo, tests and one-off runs. "hot" suits a
    # long-lived JVM serving batched runs (a Connect server): faster batched passes and full scans,
    # slower one-partition-at-a-time runs (see JIT_OPTIONS and the README).
    jit: str = "tiered"
    # Load delta-spark (the `delta` jar group) when it is installed: Spark SQL and DataFrame reads then
    # know Delta tables (`delta.`path``, `format("delta")`). Laminar's own runs do not need it.
    delta_connector: bool = True
    # The Hive metastore the session's catalog lives in (fixed when the JVM starts): None, Spark's in-memory
    # catalog (nothing outlives the session); a folder, an embedded Derby database there (one JVM at a
    # time: docs/catalog.md); a Postgres database (`postgresql://user:password@host:5432/metastore`, or its
    # `jdbc:postgresql:` URL: metastore.py), shared by any number of processes; another `jdbc:` URL, that
    # metastore database (its driver on the class path is yours to arrange). See `metastore_conf`.
    metastore: str | None = None

    def __post_init__(self) -> None:
        if self.jit not in JIT_OPTIONS:
            raise EnvironmentProblem(f"Spark option jit must be one of {', '.join(sorted(JIT_OPTIONS))}, got {self.jit!r}",
                                     field="jit")

    @classmethod
    def from_env(cls, *, master: str | None = None, remote: str | None = None, jit: str | None = None,
                 metastore: str | None = None, **kw) -> SparkOptions:
        """Options where an unset master/remote/jit/metastore comes from LAMINAR_SPARK_MASTER /
        LAMINAR_SPARK_REMOTE / LAMINAR_SPARK_JIT / LAMINAR_METASTORE; with LAMINAR_CATALOG set (the catalog
        schema) and no metastore named, the embedded one under `.laminar/metastore` (`DEFAULT_METASTORE`)."""
        return cls(master=master or os.environ.get("LAMINAR_SPARK_MASTER") or "local[*]",
                   remote=remote or os.environ.get("LAMINAR_SPARK_REMOTE") or None,
                   jit=jit or os.environ.get("LAMINAR_SPARK_JIT") or "tiered",
                   metastore=metastore or metastore_from_env(), **kw)


DEFAULT_METASTORE = ".laminar/metastore"  # the project's embedded metastore (Derby), beside its lake
# JDBC drivers of the metastore databases Laminar knows, by URL prefix
METASTORE_DRIVERS = {"jdbc:postgresql:": "org.postgresql.Driver", "jdbc:derby:": "org.apache.derby.iapi.jdbc.AutoloadedDriver"}


def metastore_from_env() -> str | None:
    """LAMINAR_METASTORE; else, with LAMINAR_CATALOG set, the project's embedded one; else None."""
    return os.environ.get("LAMINAR_METASTORE") or (DEFAULT_METASTORE if os.environ.get("LAMINAR_CATALOG") else None)


def metastore_conf(metastore: str, *, secrets: bool = True) -> dict[str, str]:
    """The JVM settings of a Hive metastore: a folder holds an embedded Derby database (`metastore_db`, its
    log `derby.log`, and the warehouse of managed tables, which Laminar never makes: its tables are external);
    a Postgres URL names a metastore database on Postgres (`metastore.py`; `secrets=False`: its password is
    taken from the JVM's environment); another `jdbc:` URL names that metastore database. A database's Hive
    tables are created on first use. Spark's own Hive client (the spark-hive jars in the pyspark wheel) talks
    to it."""
    conf = {"spark.sql.catalogImplementation": "hive",
            # the metastore's tables made on first use, in Derby and in an empty database alike
            "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
            "spark.hadoop.hive.metastore.schema.verification": "false"}
    if (db := postgres_metastore(metastore)) is not None:
        return {**conf, **postgres_conf(db, secrets=secrets)}
    if metastore.startswith("jdbc:"):
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = metastore
        driver = next((d for prefix, d in METASTORE_DRIVERS.items() if metastore.startswith(prefix)), None)
        if driver:
            conf["spark.hadoop.javax.jdo.option.ConnectionDriverName"] = driver
        return conf
    folder = os.path.abspath(metastore)
    conf.update({
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={folder}/metastore_db;create=true",
        "spark.sql.warehouse.dir": f"{folder}/warehouse",
        # a Derby database another JVM holds stays held until that one ends: fail the first time, not after
        # Hive's ten attempts two seconds apart (and DataNucleus's own) took most of a minute
        "spark.hadoop.hive.hmshandler.retry.attempts": "1",
    })
    return conf


def _quiet_python_loggers() -> None:
    # PySpark logs every analysis error as JSON before raising it; Laminar reports its own message.
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger", "py4j", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def session_conf(options: SparkOptions) -> dict[str, str]:
    """The Spark settings Laminar runs with, local or remote (a Connect server takes the same ones)."""
    return {
        "spark.app.name": options.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(options.shuffle_partitions),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.hadoop.parquet.enable.summary-metadata": "false",
        # A run's shuffles are small and hash-partitioned on purpose (one file per partition); adaptive
        # execution would only split each write into one Spark job per query stage.
        "spark.sql.adaptive.enabled": "false",
        # A run names its files explicitly: list them in the driver, not in a Spark job per read.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
        # With delta-spark (`laminar sql` on delta.`path`, a user's OPTIMIZE or VACUUM): a table's
        # snapshot state in as many tasks as a shuffle, not Delta's 50, and VACUUM's file listing
        # likewise, not 10,000 tasks. Each task generates its code: 20 rows took 80 s to VACUUM.
        "spark.databricks.delta.snapshotPartitions": str(options.shuffle_partitions),
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(options.shuffle_partitions),
        # PySpark's DataFrame debugging records each API call's Python call site in the JVM: five
        # Py4J round trips per call, a third of all of them in a run (Laminar names its own errors).
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        **options.conf,
    }


def jvm_conf(options: SparkOptions, *, secrets: bool = True) -> dict[str, str]:
    """Settings fixed when the JVM starts (the local driver, or the Connect server Laminar launches).
    With a connector's jars installed (`jars`: s3a's), the object stores this process knows now are
    reachable through it (`storage.spark_conf`: the environment's or a scheme-wide mount's settings, and
    each mounted root's per-bucket ones); with delta-spark's jars installed (and `delta_connector`), Spark
    knows Delta tables; `secrets=False` leaves the credentials out (a server started as a process of its
    own gets them in its environment, not on its command line)."""
    log4j = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    java_options = f"-Dlog4j2.configurationFile=file:{log4j}"
    if options.class_sharing and (archive := class_archive.use_options()):
        java_options += f" {archive}"
    if JIT_OPTIONS[options.jit]:
        java_options += f" {JIT_OPTIONS[options.jit]}"
    if options.java_options:
        java_options += f" {options.java_options}"
    database = postgres_metastore(options.metastore)
    if options.metastore and database is None and not options.metastore.startswith("jdbc:"):
        java_options += f" -Dderby.stream.error.file={os.path.abspath(options.metastore)}/derby.log"
    conf = {
        "spark.driver.memory": options.driver_memory,
        "spark.driver.extraJavaOptions": java_options,
        # Local files are written by Spark and committed by deltalake: no checksum side files.
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    }
    # each object store's connector (s3a: the "s3" group), where its jars are installed
    connectors = {cls.schemes[0]: jars.installed(cls.jars) for cls in storage.object_store_classes() if cls.jars}
    stores = tuple(scheme for scheme, found in connectors.items() if found)
    connector_jars = [jar for found in connectors.values() for jar in found]
    delta = jars.installed("delta") if options.delta_connector else []
    if connector_jars or delta:  # the driver ships them to a cluster's executors too
        conf["spark.jars"] = ",".join([*connector_jars, *delta])
    if delta:
        conf.update(DELTA_CONF)
    if stores:
        store = storage.spark_conf(schemes=stores)
        conf.update({k: v for k, v in store.items() if secrets or not _secret(k)})
        # Spark's commit of the files a write job puts in its folder renames each task's files once (v2),
        # not twice: on an object store a rename is a copy. The folder is the call's own; the Delta commit
        # publishes it.
        conf["spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version"] = "2"
    if options.metastore:
        conf.update(metastore_conf(options.metastore, secrets=secrets))
    if database is not None:
        # Hive's DataNucleus loads the JDBC driver through the driver's own class path: `spark.jars` is too late
        if not (driver := jars.installed("postgres")):
            raise EnvironmentProblem(
                f"the Hive metastore database {database.where} needs PostgreSQL's JDBC driver, which is not "
                "installed: run `make install` (or `python -m laminar_assets.deploy.jar_installer postgres`)",
                field="metastore")
        conf["spark.driver.extraClassPath"] = os.pathsep.join(driver)
    if options.master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        # Python workers on this machine run this interpreter (the project's venv), not whatever
        # `python3` is first on PATH; a cluster's executors take PYSPARK_PYTHON instead.
        conf["spark.pyspark.python"] = sys.executable
    return conf


# What a session needs to treat Delta tables as Delta (delta-spark's documented set-up): its SQL
# commands and its catalog for `delta.`path`` names and DESCRIBE HISTORY.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_available(spark) -> bool:
    """Whether `spark` was started with delta-spark (see DELTA_CONF), local or over Spark Connect."""
    return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")


def use_object_store(spark, root: str) -> None:
    """Point the session's connector at the store of `root` (`laminar_assets.storage`) for the files Spark
    reads and writes from now on, with the per-bucket settings of `root`'s bucket (`fs.s3a.bucket.<b>.*`):
    set when a run's root is in a bucket, so a session started before the store was known (a long-lived
    one) still reaches it, and roots in buckets on different stores share one session. Credentials are left
    to the JVM's environment or its start-up settings when the session is a Spark Connect client."""
    remote = not hasattr(spark, "sparkContext") or type(spark).__module__.startswith("pyspark.sql.connect")
    for key, value in storage.spark_conf(root).items():
        if not (remote and _secret(key)):
            spark.conf.set(key.removeprefix("spark.hadoop."), value)


def _secret(key: str) -> bool:
    # s3a's keys end with their name; ABFS's per-account ones (fs.azure.account.key.<host>) with the host
    return key.endswith((".access.key", ".secret.key", ".session.token")) or any(
        part in key for part in (".azure.account.key", ".azure.sas.fixed.token"))


def check_endpoint(remote: str, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at a Spark Connect URL (the client would retry for minutes)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(remote.replace("sc://", "http://", 1))
    host, port = url.hostname or "localhost", url.port or 15002
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot connect to the Spark Connect server at {remote} ({exc.strerror or exc}): start one with "
            "`laminar serve` (or `make ui`), or point LAMINAR_SPARK_REMOTE / SparkResource.remote at a running "
            "endpoint", remote=remote) from None


def build_session(options: SparkOptions | None = None):
    """Create (or reuse) the SparkSession for `options`: local/cluster, or a Spark Connect client."""
    from pyspark.sql import SparkSession

    options = options or SparkOptions()
    _quiet_python_loggers()
    if options.remote:
        check_endpoint(options.remote)
        # A process is either local or Connect (pyspark.sql.functions follows the mode), so a
        # remote session cannot start beside a local one: pyspark says so (SESSION_ALREADY_EXIST).
        builder = SparkSession.builder.remote(options.remote)
        # Only SQL settings are per session; the server was started with the rest (see jvm_conf).
        conf = {k: v for k, v in session_conf(options).items() if k.startswith("spark.sql.")}
    else:
        check_java()
        if _no_local_session():
            check_metastore(options.metastore)  # a wrong password: one line now, not a Hive trace later
        builder = SparkSession.builder.master(options.master)
        conf = {**jvm_conf(options), **session_conf(options)}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not options.remote:
        spark.sparkContext.setLogLevel(options.log_level)
    return spark


def _no_local_session() -> bool:
    from pyspark import SparkContext

    return SparkContext._active_spark_context is None


def start_session(options: SparkOptions) -> threading.Thread:
    """Start the session for `options` in a background thread (a JVM takes seconds to start), so it
    overlaps with what the caller does next; the caller's own `build_session(options)` then finds it
    (pyspark's builder serializes the two). A failure here is not reported: that later call starts
    the session itself and raises the same error with its own message."""

    def start() -> None:
        try:
            build_session(options)
        except Exception:  # noqa: BLE001 - the caller's own start raises it with context (see docstring)
            return

    thread = threading.Thread(target=start, name="laminar-spark-start", daemon=True)
    thread.start()
    return thread

