"""`laminar sql`'s guard: which statements may run, judged by Spark's own parse before anything runs,
through a local session's parser and through EXPLAIN (the way a Spark Connect session parses)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine.report.sql_guard import check_read_only, check_text
from laminar_assets.errors import LaminarError

pytestmark = pytest.mark.spark


class Remote:
    """A local session as a Spark Connect session shows itself to the guard: no JVM handle, so it
    parses with EXPLAIN EXTENDED on the real Spark (`spark.sql` and `spark.conf` only)."""

    def __init__(self, spark):
        self.sql, self.conf = spark.sql, spark.conf


def session(spark, how: str):
    return spark if how == "local" else Remote(spark)


ALLOWED = [
    "SELECT * FROM vwap_1m",
    "select symbol, count(*) FROM vwap_1m WHERE trades > 1 GROUP BY symbol HAVING count(*) > 1 ORDER BY 1 LIMIT 5 OFFSET 2",
    "WITH a AS (SELECT 1 AS x) SELECT * FROM a WHERE x IN (SELECT x FROM a) AND EXISTS (SELECT 1)",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r",
    "VALUES (1, 'a'), (2, 'b')",
    "TABLE vwap_1m",
    "(SELECT 1) UNION ALL (SELECT 2) EXCEPT SELECT 3",
    "FROM vwap_1m SELECT symbol",
    "FROM vwap_1m |> WHERE trades > 1 |> AGGREGATE count(*) GROUP BY symbol",
    "SELECT * FROM vwap_1m TABLESAMPLE (50 PERCENT) LATERAL VIEW explode(array(1)) e AS x",
    "SELECT /*+ BROADCAST(s) */ * FROM vwap_1m v JOIN symbols s USING (symbol) DISTRIBUTE BY symbol SORT BY symbol",
    "SELECT * FROM vwap_1m PIVOT (sum(trades) FOR symbol IN ('A', 'B'))",
    "SELECT symbol, sum(trades) OVER w FROM vwap_1m WINDOW w AS (PARTITION BY symbol)",
    "SELECT * FROM range(3), LATERAL (SELECT 1)",
    "SELECT * FROM delta.`/tmp/no/such/table` t JOIN delta.`/tmp/no/such/other` USING (a)",
    "SELECT 1 AS `reflect`, 'java_method' AS s, reflect FROM t",  # names and strings, not calls
    "SELECT * FROM vwap_1m WHERE reason = 'a\\nb' -- a literal of two lines\n",
    "SELECT " + ", ".join(str(i) for i in range(40)),
    "SELECT 1;",
    "SHOW TABLES", "SHOW COLUMNS IN vwap_1m", "SHOW TBLPROPERTIES vwap_1m", "SHOW FUNCTIONS", "SHOW CREATE TABLE vwap_1m",
    "DESCRIBE vwap_1m", "DESCRIBE TABLE EXTENDED vwap_1m symbol", "DESCRIBE QUERY SELECT 1", "DESCRIBE FUNCTION reflect",
    "DESCRIBE HISTORY delta.`/tmp/lake/vwap_1m`", "DESC HISTORY delta.`/tmp/lake/vwap_1m` LIMIT 2",
    "DESCRIBE DETAIL delta.`/tmp/lake/vwap_1m`",
    "EXPLAIN SELECT * FROM vwap_1m", "EXPLAIN FORMATTED WITH a AS (SELECT 1) SELECT * FROM a",
    "EXPLAIN /* c */ EXTENDED SELECT 1", "-- a comment first\nSELECT 1",
    "EXPLAIN /* a /* nested */ comment */ SELECT 1", "DESCRIBE TABLE EXTENDED vwap_1m AS JSON",
    "DESC DETAIL '/tmp/lake/vwap_1m'", "DESCRIBE HISTORY '/tmp/lake/vwap_1m' LIMIT 1",
]

# A name computed by IDENTIFIER(<expression>): by the parse, a function so named; over Spark Connect the word
# itself (its EXPLAIN would resolve the name, and optimizing may call the function, before the guard sees it).
DYNAMIC = r"(a function named by IDENTIFIER\(<expression>\)|IDENTIFIER\(\.\.\.\), which over Spark Connect)"

REFUSED = [  # (statement, what the message says was found: a regex)
    ("FROM symbols INSERT OVERWRITE DIRECTORY '/tmp/lake/symbols' USING parquet SELECT * WHERE false",
     "INSERT OVERWRITE DIRECTORY"),
    ("INSERT OVERWRITE LOCAL DIRECTORY '/tmp/x' SELECT 1", "INSERT"),
    ("INSERT INTO vwap_1m SELECT * FROM vwap_1m", "INSERT"),
    ("FROM a INSERT INTO t SELECT * INSERT INTO u SELECT *", "INSERT"),
    ("WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a", "INSERT"),
    ("RESTORE TABLE delta.`/tmp/lake/vwap_1m` TO VERSION AS OF 0", "RESTORE"),
    ("REORG TABLE delta.`/tmp/lake/vwap_1m` APPLY (PURGE)", "REORG"),
    ("CONVERT TO DELTA parquet.`/tmp/x`", "CONVERT"),
    ("OPTIMIZE delta.`/tmp/x`", "OPTIMIZE"),
    ("VACUUM delta.`/tmp/x` RETAIN 0 HOURS", "VACUUM"),
    ("GENERATE symlink_format_manifest FOR TABLE delta.`/tmp/x`", "GENERATE"),
    ("CREATE TABLE t AS SELECT 1", "CREATE"),
    ("CREATE OR REPLACE TABLE t USING delta AS SELECT 1", "(REPLACE TABLE|CREATE)"),
    ("CREATE TABLE c SHALLOW CLONE t", "(CLONE|CREATE)"),
    ("CREATE TEMPORARY VIEW v AS SELECT 1", "CREATE"),
    ("CREATE TEMPORARY FUNCTION f AS 'x.Y'", "CREATE"),
    ("DROP TABLE t", "DROP"),
    ("ALTER TABLE t ADD COLUMNS (x int)", "ALTER TABLE"),
    ("ALTER TABLE t SET TBLPROPERTIES ('a' = 'b')", "ALTER TABLE"),
    ("ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0)", "ALTER TABLE"),
    ("CREATE TEMPORARY FUNCTION f() RETURNS INT RETURN 1", "CREATE FUNCTION"),
    ("LIST FILE", "LIST FILE"),
    ("SELECT * FROM STREAM(t)", r"a streaming read \(STREAM\)"),
    ("CACHE TABLE t", "CACHE"),
    ("CACHE LAZY TABLE c AS SELECT 1", "CACHE"),
    ("UNCACHE TABLE t", "UNCACHE"),
    ("CLEAR CACHE", "CLEAR"),
    ("SET spark.sql.shuffle.partitions = 7", "SET"),
    ("SET", "SET"),
    ("RESET", "RESET"),
    ("SET VAR v = 1", "SET"),
    ("DECLARE VARIABLE v INT", "(DECLARE)"),
    ("USE db", "USE"),
    ("ADD JAR /tmp/x.jar", "ADD"),
    ("MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE", "MERGE"),
    ("UPDATE t SET a = 1", "UPDATE"),
    ("DELETE FROM t WHERE a = 1", "DELETE"),
    ("TRUNCATE TABLE t", "TRUNCATE"),
    ("REFRESH TABLE t", "REFRESH"),
    ("MSCK REPAIR TABLE t", "MSCK"),
    ("ANALYZE TABLE t COMPUTE STATISTICS", "ANALYZE"),
    ("LOAD DATA LOCAL INPATH '/tmp/x' INTO TABLE t", "LOAD"),
    ("CALL system.x()", "CALL"),
    ("EXECUTE IMMEDIATE 'DROP TABLE t'", "EXECUTE"),
    ("BEGIN SELECT 1; DROP TABLE t; END", "(a SQL script|BEGIN)"),
    ("SELECT 1; SELECT 2", "several statements"),
    ("SELECT 1; DROP TABLE t", "several statements"),
    ("SELECT TRANSFORM(symbol) USING 'cat' AS (b) FROM vwap_1m", r"SELECT TRANSFORM \(it runs a program\)"),
    ("DESCRIBE QUERY SELECT TRANSFORM(symbol) USING 'cat' AS (b) FROM vwap_1m", "SELECT TRANSFORM"),
    ("EXPLAIN INSERT INTO t SELECT 1", "INSERT"),
    ("EXPLAIN EXPLAIN DROP TABLE t", "DROP"),
    # functions that reach the JVM or files, however they are spelled
    ("SELECT java_method('java.lang.Math', 'abs', -1)", "function java_method, which calls Java methods"),
    ("SELECT `reflect`('java.lang.Math', 'abs', -1)", "function reflect"),
    ("SELECT system.builtin.try_reflect('a', 'b')", "function try_reflect"),
    ("SELECT JAVA_METHOD ('a', 'b')", "function java_method"),
    ("SELECT reflect/* a comment before the parenthesis */('a', 'b')", "function reflect"),
    ("SELECT * FROM reflect/**/('java.lang.Math', 'abs', -1)", "function reflect"),
    ("SELECT transform(array(1), x -> reflect/**/('java.lang.Math', 'abs', x))", "function reflect"),
    ("SELECT " + ", ".join(str(i) for i in range(40)) + ", java_method/**/('a', 'b')", "function java_method"),
    ("SELECT IDENTIFIER('java_' || 'method')('java.lang.Math', 'abs', -1)", DYNAMIC),
    ("SELECT from_protobuf(x, 'M', '/etc/passwd')", "function from_protobuf, which reads a descriptor file"),
    # option keys may be computed (map(lower('ROWVALIDATIONXSDPATH'), ...)): the functions are refused outright
    ("SELECT from_xml/* /* */ */('<ROW/>', 'a INT', map('rowValidationXSDPath', '/tmp/no.xsd', 'mode', 'FAILFAST'))",
     "function from_xml, which reads the XSD file its rowValidationXSDPath option names"),
    ("SELECT schema_of_xml('<ROW/>', map('rowValidationXSDPath', '/tmp/no.xsd'))", "function schema_of_xml"),
    ("SELECT from_avro(x, '{}', map('avroSchemaUrl', 'file:///etc/passwd')) FROM t",
     "function from_avro, which reads the schema file its avroSchemaUrl option names"),
    ("SELECT schema_of_avro('{}', map('avroSchemaUrl', 'file:///etc/passwd'))", "function schema_of_avro"),
    ("SELECT IDENTIFIER('from_' || 'xml')('<ROW/>', 'a INT', map('rowValidationXSDPath', '/tmp/no.xsd', 'mode', 'FAILFAST'))",
     DYNAMIC),
    # tables: by name, or Delta tables by path; nothing else
    ("SELECT * FROM parquet.`/tmp/lake/vwap_1m`", r"parquet.`/tmp/lake/vwap_1m`, which reads files without a Delta log"),
    ("SELECT * FROM vwap_1m UNION ALL SELECT * FROM json.`/etc/passwd`", "json.`/etc/passwd`"),
    ("SELECT * FROM spark_catalog.default.t", "spark_catalog.default.t, a table of another catalog"),
    ("SELECT * FROM IDENTIFIER('a' || 'b')", r"a table named by IDENTIFIER\(<expression>\)"),
    # a comment delta-spark's lexer does not nest: it reads RESTORE where Spark's reads SELECT 1
    ("/* /* */ RESTORE TABLE delta.`/tmp/lake/vwap_1m` TO VERSION AS OF 0 -- */ SELECT 1", "RESTORE"),
    # an EXPLAIN or DESCRIBE QUERY judges the statement Spark's lexer finds after its keywords: its comments
    # nest, and a `--` comment goes on past a line break after a backslash
    ("EXPLAIN /* /* */ SELECT ' */ SELECT * FROM csv.`/tmp/x` --'", r"csv.`/tmp/x`, which reads files"),
    ("EXPLAIN -- \\\n SELECT '\n SELECT * FROM csv.`/tmp/x` --'", r"csv.`/tmp/x`, which reads files"),
    ("DESCRIBE /* /* */ SELECT ' */ SELECT * FROM csv.`/tmp/x` --'", r"csv.`/tmp/x`, which reads files"),
    ("", "nothing"),
]


# The statements judged through EXPLAIN too (each EXPLAIN analyzes and plans: ~0.5 s): every kind of
# step that path takes (first word, delta-spark's DESCRIBE, wrappers, plan lines, functions, names).
REMOTE = {
    "SELECT * FROM vwap_1m", "VALUES (1, 'a'), (2, 'b')", "(SELECT 1) UNION ALL (SELECT 2) EXCEPT SELECT 3",
    "SELECT * FROM vwap_1m WHERE reason = 'a\\nb' -- a literal of two lines\n", "SELECT 1;", "SHOW COLUMNS IN vwap_1m",
    "DESCRIBE QUERY SELECT 1", "DESCRIBE HISTORY delta.`/tmp/lake/vwap_1m`", "DESC HISTORY delta.`/tmp/lake/vwap_1m` LIMIT 2",
    "DESCRIBE DETAIL delta.`/tmp/lake/vwap_1m`", "EXPLAIN FORMATTED WITH a AS (SELECT 1) SELECT * FROM a",
    "-- a comment first\nSELECT 1", "SELECT " + ", ".join(str(i) for i in range(40)),
    "FROM symbols INSERT OVERWRITE DIRECTORY '/tmp/lake/symbols' USING parquet SELECT * WHERE false",
    "WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a", "RESTORE TABLE delta.`/tmp/lake/vwap_1m` TO VERSION AS OF 0",
    "CONVERT TO DELTA parquet.`/tmp/x`", "SET spark.sql.shuffle.partitions = 7", "BEGIN SELECT 1; DROP TABLE t; END",
    "SELECT 1; DROP TABLE t", "SELECT TRANSFORM(symbol) USING 'cat' AS (b) FROM vwap_1m",
    "DESCRIBE QUERY SELECT TRANSFORM(symbol) USING 'cat' AS (b) FROM vwap_1m", "EXPLAIN INSERT INTO t SELECT 1",
    "SELECT transform(array(1), x -> reflect/**/('java.lang.Math', 'abs', x))",
    "SELECT " + ", ".join(str(i) for i in range(40)) + ", java_method/**/('a', 'b')",
    "SELECT IDENTIFIER('java_' || 'method')('java.lang.Math', 'abs', -1)", "SELECT * FROM parquet.`/tmp/lake/vwap_1m`",
    "SELECT from_xml/* /* */ */('<ROW/>', 'a INT', map('rowValidationXSDPath', '/tmp/no.xsd', 'mode', 'FAILFAST'))",
    "SELECT IDENTIFIER('from_' || 'xml')('<ROW/>', 'a INT', map('rowValidationXSDPath', '/tmp/no.xsd', 'mode', 'FAILFAST'))",
    "SELECT * FROM spark_catalog.default.t",
    "/* /* */ RESTORE TABLE delta.`/tmp/lake/vwap_1m` TO VERSION AS OF 0 -- */ SELECT 1", "",
}


def cases(statements):
    """(how, statement...) for each statement: through the local parser, and through EXPLAIN if in REMOTE."""
    rows = [(s if isinstance(s, tuple) else (s,)) for s in statements]
    return [pytest.param(how, *row, id=f"{how}-{row[0][:60]}") for how in ("local", "remote") for row in rows
            if how == "local" or row[0] in REMOTE]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """A Delta table of two versions."""
    path = str(tmp_path_factory.mktemp("guard") / "t")
    write_deltalake(path, pd.DataFrame({"a": [1, 2]}))
    write_deltalake(path, pd.DataFrame({"a": [3]}), mode="append")
    return path


def files_under(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, names in os.walk(path) for f in names)


@pytest.mark.parametrize(("how", "statement"), cases(ALLOWED))
def test_statements_that_read_pass(spark, how, statement):
    check_read_only(session(spark, how), statement)


@pytest.mark.parametrize(("how", "statement", "found"), cases(REFUSED))
def test_every_other_statement_is_refused_naming_what_it_is(spark, how, statement, found):
    with pytest.raises(LaminarError) as info:
        check_read_only(session(spark, how), statement)
    message = str(info.value)
    assert re.search(f"found {found}", message) and "\n" not in message, message
    assert "reads only" in message or "Delta tables by path" in message, message


@pytest.mark.parametrize("how", ["local", "remote"])
def test_a_syntax_error_is_sparks_own_line_with_positions_as_typed(spark, how):
    with pytest.raises(LaminarError) as info:
        check_read_only(session(spark, how), "SELECT *\nFROM vwap_1m WHERE symbol =")
    message = str(info.value)
    assert message.startswith("query failed: [PARSE_SYNTAX_ERROR]") and "end of input" in message, message
    assert "(line 2, pos 27)" in message and "\n" not in message, message


PROBE = "laminar.guard.probe"


@pytest.mark.parametrize("how", ["local", "remote"])
def test_refused_statements_change_nothing_even_when_explained(spark, how, table):
    """EXPLAIN (how a Connect session parses) plans a statement without running it: the table keeps
    its log, files and version; a SET leaves the session's setting; a reflective call runs nothing."""
    files = files_under(table)
    for statement in (f"FROM (SELECT 9 AS a) INSERT OVERWRITE DIRECTORY '{table}' USING parquet SELECT *",
                      f"WITH a AS (SELECT 9 AS a) INSERT OVERWRITE DIRECTORY '{table}' USING parquet SELECT * FROM a",
                      f"EXPLAIN INSERT INTO delta.`{table}` SELECT 9", f"EXPLAIN DELETE FROM delta.`{table}`",
                      f"/* /* */ RESTORE TABLE delta.`{table}` TO VERSION AS OF 0 -- */ SELECT 1",
                      "SET spark.sql.shuffle.partitions = 77",
                      f"SELECT java_method/**/('java.lang.System', 'setProperty', '{PROBE}', 'x')",
                      f"VALUES (java_method/**/('java.lang.System', 'setProperty', '{PROBE}', 'x'))"):  # parse-time VALUES
        with pytest.raises(LaminarError, match="reads only"):
            check_read_only(session(spark, how), statement)
    assert files_under(table) == files and DeltaTable(table).version() == 1
    assert spark._jvm.java.lang.System.getProperty(PROBE) is None
    assert spark.conf.get("spark.sql.shuffle.partitions") != "77"
    assert spark.conf.get("spark.sql.debug.maxToStringFields") == "25"  # the guard's own settings are undone
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "true"


class Recording(Remote):
    """A `Remote` that keeps every row the real Spark answered (what the guard's EXPLAIN printed)."""

    def __init__(self, spark):
        super().__init__(spark)
        self.printed: list[str] = []
        self.sql = lambda text: self._answered(spark.sql(text).collect())

    def _answered(self, rows):
        self.printed += [str(row[0]) for row in rows]
        return SimpleNamespace(collect=lambda: rows)


@pytest.fixture
def secret(tmp_path) -> str:
    """A file outside any lake whose first line is the secret (a CSV read with a header names a column so)."""
    path = tmp_path / "secret.csv"
    path.write_text("top secret\n")
    return str(path)


HIDDEN_READS = [  # EXPLAIN of a read of the secret file, behind a comment that Spark's lexer and a regex read apart
    "EXPLAIN /* /* */ SELECT ' */ SELECT nosuch FROM csv.`{secret}` WITH (\"header\" = \"true\") --'",
    "EXPLAIN -- \\\n SELECT '\n SELECT nosuch FROM csv.`{secret}` WITH (\"header\" = \"true\") --'",
]


@pytest.mark.parametrize("statement", HIDDEN_READS)
def test_over_spark_connect_what_runs_is_the_statement_judged(spark, secret, statement):
    """Over Spark Connect the guard cuts EXPLAIN's statement from the text (its EXPLAIN prints only the root of
    an EXPLAIN's plan): what runs is rebuilt from EXPLAIN and the statement judged, never the text as typed, so a
    comment the cut reads otherwise than Spark cannot hide a file read."""
    statement = statement.format(secret=secret)
    to_run = check_read_only(Remote(spark), statement)
    assert len(to_run) == len(statement) and "/*" not in to_run.split("SELECT")[0]  # positions kept, no comment
    printed = "\n".join(row[0] for row in spark.sql(to_run).collect())
    assert "top secret" not in printed, printed


def test_over_spark_connect_the_guards_explain_reads_no_file(spark, secret):
    """Spark analyzes what it explains: a read by path is not resolved while the guard explains (a CSV read
    with a header would name its columns after the file's first line), and nothing of the file is printed."""
    remote = Recording(spark)
    with pytest.raises(LaminarError, match="reads files without a Delta log"):
        check_read_only(remote, f"SELECT nosuch FROM csv.`{secret}` WITH ('header' = 'true')")
    assert remote.printed and not any("top secret" in out for out in remote.printed), remote.printed
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "true"


def test_function_names_are_refused_from_the_text_alone():
    with pytest.raises(LaminarError, match="function reflect, which calls Java methods in Spark's JVM"):
        check_text("SELECT `reflect` ('java.lang.Math', 'abs', -1)")
    check_text("SELECT reflect, 'java_method' FROM t")  # a column and a string: no call


def test_the_remote_cases_are_cases():
    assert REMOTE <= set(ALLOWED) | {s for s, _ in REFUSED}


def test_the_documented_queries_pass(spark):
    """Every `laminar sql "..."` the README and docs/cli.md show, and `DESCRIBE HISTORY vwap_1m`."""
    from laminar_assets.engine.report.system_tables import references

    repo = Path(__file__).resolve().parents[3]
    shown = [q for doc in (repo / "README.md", repo / "docs" / "cli.md")
             for q in re.findall(r'laminar sql "((?:[^"\\]|\\.)+)"', doc.read_text()) if q != "QUERY" and "..." not in q]
    assert len(shown) >= 3, shown
    for query in [*shown, "DESCRIBE HISTORY delta.`/tmp/lake/vwap_1m`"]:
        check_read_only(spark, references(query)[2])  # as run_query judges it: laminar_system.x as its view
