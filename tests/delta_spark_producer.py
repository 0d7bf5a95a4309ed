"""An upstream Spark job writing Delta tables with delta-spark, in a process of its own.

Tests drive it as a producer: `DeltaSparkProducer.sql(...)` sends one statement (INSERT, MERGE,
UPDATE, DELETE, OPTIMIZE, REORG, VACUUM, ALTER TABLE ...) to a plain Spark session with Delta's
extension, as a user's job would run it, and returns the rows it produced; `script([...])` sends
many in one round trip (each one's rows or error), `version(path)` a table's version. The
process is not Laminar's and shares no JVM with the tests' session.

Run as `python -m tests.delta_spark_producer`: one JSON request per line on stdin, one JSON answer
per line on stdout.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

DELTA_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    # a small table's snapshot in one task, not Delta's 50, and VACUUM's file listing in one task,
    # not 10,000: each task generates its code, which made a VACUUM of 20 rows take 80 s here
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "1",
    # tests vacuum with RETAIN 0 HOURS, as the differential run of the integrity issue did
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # interpreted expressions: the tables are tiny, and generating and compiling the code of each of delta-spark's
    # many internal queries (MERGE, OPTIMIZE, snapshot state) cost more than running them; the files written are
    # the same. tests/engine/delta/test_delta_spark_producers.py: 100-102 CPU s against 112-114 (alternated).
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


class ProducerError(RuntimeError):
    """A statement the producer's Spark refused (the message is Spark's)."""


class DeltaSparkProducer:
    """The client side: starts the producer process and sends it statements."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = timeout
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.delta_spark_producer"], cwd=root, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, bufsize=1)
        try:
            self._answer()  # the session is up
        except BaseException:
            self.close()
            raise

    def sql(self, statement: str) -> list[list]:
        """Run one statement; its result rows (as lists)."""
        return self._request({"sql": statement})["rows"]

    def script(self, statements: list[str]) -> list[list[list] | ProducerError]:
        """Run statements in order in one round trip; each one's result rows, or the `ProducerError` Spark
        raised for it (the next ones still run: a test decides which refusals it expects)."""
        answers = self._request({"script": list(statements)})["results"]
        return [ProducerError(a["error"]) if "error" in a else a["rows"] for a in answers]

    def version(self, path: str) -> int:
        return int(self._request({"version": path})["version"])

    def read(self, path: str, version: int | None = None, *, change_feed_from: int | None = None) -> list[dict]:
        """Rows of the table at `version` (latest if None) as delta-spark reads them (deletion vectors
        applied), or its change data feed from `change_feed_from` on."""
        return self._request({"read": path, "version": version, "cdf": change_feed_from})["rows"]

    def _request(self, request: dict) -> dict:
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise ProducerError(answer["error"])
        return answer

    def _answer(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._proc.poll() is not None:
                raise ProducerError("the delta-spark producer process died or timed out")
            ready, _, _ = select.select([self._proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = self._proc.stdout.readline()
                if line.startswith("{"):
                    return json.loads(line)
                if not line:
                    raise ProducerError("the delta-spark producer process closed its output")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _jsonable(value):
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return {k: _jsonable(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _error(exc: Exception) -> str:
    """Spark's message in one line: a Py4J error's first line only says which call failed, the JVM's
    exception (`: org.apache....Exception: message`) follows it."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        return lines[1].lstrip(": ")
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _jvm_options() -> dict[str, str]:
    """How the JVM starts, as the suite's own JVMs start (tests/conftest.py): the class archive `make
    class-archive` wrote, C1 only (LAMINAR_SPARK_JIT, default quick) and the serial collector. A
    short-lived JVM on two cores spends most of its CPU in the C2 compiler (docs/PERFORMANCE.md).
    Only the JVM's options: the session stays a plain delta-spark one (Hadoop's checksummed local
    file system, no Laminar setting)."""
    from laminar_assets.engine import SparkOptions
    from laminar_assets.engine.spark.session import jvm_conf
    from tests.conftest import TEST_JAVA_OPTIONS

    conf = jvm_conf(SparkOptions(master="local[1]", driver_memory="1g", java_options=TEST_JAVA_OPTIONS,
                                 jit=os.environ.get("LAMINAR_SPARK_JIT", "quick")), secrets=False)
    return {key: conf[key] for key in ("spark.driver.memory", "spark.driver.extraJavaOptions")}


def _serve() -> None:
    from pyspark.sql import SparkSession

    from laminar_assets.engine.spark import installed_jars
    from laminar_assets.engine.spark.session import DELTA_CONF

    os.environ["TZ"] = "UTC"  # timestamps come back as this process's local time: make that UTC
    time.tzset()
    jars = installed_jars("delta")
    if not jars:
        raise SystemExit("delta-spark's jars are not installed: python -m laminar_assets.deploy.jar_installer delta")
    out = sys.stdout
    sys.stdout = sys.stderr  # Spark's chatter never mixes with the answers
    builder = SparkSession.builder.master("local[1]").appName("upstream-delta-job").config("spark.jars", ",".join(jars))
    for key, value in {**DELTA_CONF, **DELTA_SQL_CONF, **_jvm_options()}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    def rows(statement: str) -> dict:
        try:
            return {"rows": [_jsonable(list(r)) for r in spark.sql(statement).collect()]}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
            return {"error": _error(exc)}

    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "script" in request:
                answer = {"results": [rows(s) for s in request["script"]]}
            elif "sql" in request:
                answer = {"rows": [_jsonable(list(r)) for r in spark.sql(request["sql"]).collect()]}
            elif "read" not in request:
                history = spark.sql(f"DESCRIBE HISTORY delta.`{request['version']}` LIMIT 1").collect()
                answer = {"version": history[0]["version"]}
            else:
                reader = spark.read.format("delta")
                if request.get("cdf") is not None:
                    reader = reader.option("readChangeFeed", "true").option("startingVersion", request["cdf"])
                elif request.get("version") is not None:
                    reader = reader.option("versionAsOf", request["version"])
                answer = {"rows": [_jsonable(r.asDict()) for r in reader.load(request["read"]).collect()]}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
            answer = {"error": _error(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    spark.stop()


if __name__ == "__main__":
    from laminar_assets.process_exit import run_then_exit

    run_then_exit(_serve)  # ends with its own exit code, never a teardown's abort (docs/known-limits.md)
