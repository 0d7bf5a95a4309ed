"""The fixed costs a test pays before it tests anything, each measured alone: `python -m tests.startup_costs`.

docs/testing.md keeps the numbers of the last measurement. Each line is wall seconds from asking to the first
useful answer (a session that ran a query, a server that answered), so the table says what sharing one of
each per test process saves. Every server started here binds 127.0.0.1 and is stopped before the next starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

ROWS: list[tuple[str, float]] = []


@contextmanager
def timed(what: str):
    started = time.monotonic()
    yield
    ROWS.append((what, time.monotonic() - started))
    print(f"{ROWS[-1][1]:8.1f} s  {what}", flush=True)


def python_imports() -> None:
    code = "import laminar_assets.definitions"
    with timed("Python: import the Dagster definitions (Dagster, PySpark, deltalake modules)"):
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "LAMINAR_ROOT": tempfile.mkdtemp()})


def local_spark(folder: str) -> None:
    from laminar_assets.engine import SparkOptions, build_session

    with timed("Spark: a local session (JVM start, Delta extensions)"):
        spark = build_session(SparkOptions(master="local[2]", shuffle_partitions=2, driver_memory="2g"))
    table = os.path.join(folder, "t")
    query = f"SELECT k, sum(v) FROM delta.`{table}` GROUP BY k"
    with timed("Spark: the first Delta write of 3 rows"):
        spark.createDataFrame([(1, 2.0), (2, 3.0), (1, 1.0)], "k INT, v DOUBLE").write.format("delta").save(table)
    with timed("Spark: the first aggregation query over it (plan and code compiled)"):
        spark.sql(query).collect()
    with timed("Spark: the same query again (compiled code reused)"):
        spark.sql(query).collect()
    spark.stop()


def connect_server(folder: str) -> None:
    from laminar_assets.deploy import ConnectServerOptions, start_connect_server
    from laminar_assets.engine import SparkOptions
    from tests.deploy.processes import free_port

    options = ConnectServerOptions(port=free_port(), log_path=os.path.join(folder, "connect.log"),
                                   spark=SparkOptions(driver_memory="1g", shuffle_partitions=2))
    with timed("Spark Connect: a server until it accepts connections"):
        server = start_connect_server(options)
    with server:
        from pyspark.sql import SparkSession

        with timed("Spark Connect: a client's first query"):
            client = SparkSession.builder.remote(f"sc://127.0.0.1:{options.port}").getOrCreate()
            client.range(3).collect()
        client.stop()


def servers() -> None:
    from tests.object_store import start_moto, start_s3proxy
    from tests.postgres import start_postgres

    with timed("PostgreSQL (pgserver): a server with a password role"):
        pg = start_postgres()
    pg.stop()
    with timed("moto: a local S3 server"):
        moto = start_moto()
    moto.stop()
    with timed("s3proxy: a local S3 server (a JVM)"):
        proxy = start_s3proxy()
    proxy.stop()


def dagster_instance() -> None:
    import dagster as dg

    with timed("Dagster: a temporary instance and one trivial materialization"):
        @dg.asset
        def one() -> int:
            return 1

        with dg.instance_for_test() as instance:
            assert dg.materialize([one], instance=instance).success


def chromium(folder: str) -> None:
    from tests.deploy.ui_browser import CHROMIUM_ARGS
    from tests.deploy.ui_browser import chromium as binary

    with timed("Chromium: headless, one blank page"):
        subprocess.run([binary(), *CHROMIUM_ARGS, f"--user-data-dir={folder}", "--dump-dom", "about:blank"],
                       check=True, capture_output=True, timeout=120)


def main() -> None:
    folder = tempfile.mkdtemp(prefix="laminar-costs-")
    try:
        python_imports()
        local_spark(folder)
        connect_server(folder)
        servers()
        dagster_instance()
        chromium(os.path.join(folder, "chromium"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{sum(s for _, s in ROWS):8.1f} s  in all")


if __name__ == "__main__":
    main()
