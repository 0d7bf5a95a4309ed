"""What `laminar sql` lets Spark run: one statement that reads, judged by Spark's own parser before
anything runs. An allow-list: the statement kinds that read (a query, SHOW, DESCRIBE, EXPLAIN of one
of them), the plan nodes a query is made of, tables by name or Delta tables by path; every function
that reaches the JVM or a file refused. Anything else is a one-line LaminarError naming what was found.

The parse runs no Spark job and executes nothing:

- A local session parses with its own parser (`sessionState.sqlParser.parsePlan`, delta-spark's
  when it is loaded: the same parser `spark.sql` then runs the text with) and prints the parsed plan.
- A Spark Connect session has no JVM handle, and its `spark.sql` executes a command at once. It
  parses with `EXPLAIN EXTENDED <statement>`: Spark's ExplainCommand plans the statement without
  executing it and prints its parsed plan. Spark's grammar under EXPLAIN does not know delta-spark's
  own statements (RESTORE, OPTIMIZE, VACUUM, ... which delta-spark's parser claims before Spark's
  grammar sees the text), so over Connect the first word, as delta-spark's lexer reads it, must also
  begin an allowed kind: delta-spark's statements that begin so (DESCRIBE HISTORY/DETAIL, SHOW
  COLUMNS) only read. Spark analyzes and optimizes the statement to explain it, before its parse can
  be judged: so reads by path are switched off while it explains (`spark.sql.runSQLOnFiles`; a CSV
  read with a header would name its columns after a file's first line), and the names of the refused
  functions and IDENTIFIER (a name computed there) are refused from the text wherever they appear
  (optimizing calls a function of constants).

EXPLAIN and DESCRIBE QUERY only plan or analyze the statement they wrap, which is judged in turn:
locally as Spark parsed it (the plan holds it); over Spark Connect its EXPLAIN prints only that
statement's first line, so it is cut from the text after the keywords, and what runs is rebuilt from
the keywords and the statement judged (`check_read_only` returns it): a comment that Spark's lexer
reads otherwise than a regex (they nest, and `--` goes on past a backslash-newline) hides nothing.

Reads by path: `delta.`/path`` reads the table's current snapshot through its log, as a lake table by
name does, and stays allowed (docs/cli.md documents it). Every other `<format>.`/path`` read is
refused: a Parquet read of a Delta table's folder shows the rows of removed and uncommitted files
too, a wrong answer that looks right; and other catalogs' or databases' tables are not the lake's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pyspark.errors import ParseException

from laminar_assets.errors import LaminarError

ALLOWED = "one SELECT (or WITH ... SELECT, VALUES, TABLE), SHOW, DESCRIBE or EXPLAIN statement"

# Nodes of a parsed query (the parser's output, before analysis resolves names): relational operators
# and the relations they read. A query with any other node (SELECT TRANSFORM's script, an INSERT in
# a multi-insert FROM, a table named by IDENTIFIER(<expression>)) is refused.
QUERY_NODES = frozenset({
    "Project", "Filter", "Aggregate", "Sort", "GlobalLimit", "LocalLimit", "LimitAll", "Offset", "Distinct", "Union",
    "Except", "Intersect", "Join", "LateralJoin", "Generate", "Pivot", "Unpivot", "Sample", "SubqueryAlias",
    "UnresolvedSubqueryColumnAliases", "UnresolvedHaving", "UnresolvedQualify", "CTE", "WithWindowDefinition",
    "RepartitionByExpression", "UnresolvedHint", "UnresolvedRelation", "RelationTimeTravel",
    "UnresolvedTableValuedFunction", "UnresolvedTVFAliases", "UnresolvedInlineTable", "ResolvedInlineTable",
    "LocalRelation", "OneRowRelation", "PipeOperator",
})
# Statements that describe tables, columns, functions, namespaces or a Delta table's log.
SHOW_DESCRIBE = frozenset({
    "DescribeRelation", "DescribeColumn", "DescribeTablePartition", "DescribeFunction", "DescribeNamespace",
    "DescribeProcedureCommand", "DescribeRelationJsonCommand", "DescribeDeltaHistory", "DescribeDeltaDetailCommand",
    "ShowTables",
    "ShowTablesExtended", "ShowTablePartition", "ShowViews", "ShowColumns", "ShowTableProperties", "ShowFunctions",
    "ShowCreateTable", "ShowPartitions", "ShowNamespacesCommand", "ShowCatalogsCommand",
    "ShowCurrentNamespaceCommand", "ShowCollationsCommand", "ShowProceduresCommand",
})
# What SHOW and DESCRIBE name (not read yet: the statement resolves them when it runs); delta-spark's
# DESCRIBE HISTORY/DETAIL '/path' names a Delta table by path.
REFERENCES = frozenset({"UnresolvedTableOrView", "UnresolvedTable", "UnresolvedNamespace", "CurrentNamespace$",
                        "UnresolvedFunctionName", "UnresolvedProcedure", "UnresolvedPathBasedTable",
                        "UnresolvedPathBasedDeltaTable"})
_BELOW_ROOT = QUERY_NODES | REFERENCES
# Statements that only plan or analyze another statement, never run it: that one is judged in turn (see
# `_wrapped`). Over Spark Connect it is cut from the text after these keywords.
_TRIVIA = r"(?:\s|--[^\n]*|/\*.*?\*/)*"
WRAPPERS = {
    "ExplainCommand": re.compile(rf"{_TRIVIA}(?P<keyword>EXPLAIN)\b{_TRIVIA}"
                                 r"(?P<mode>(?:LOGICAL|FORMATTED|EXTENDED|CODEGEN|COST)\b)?", re.IGNORECASE | re.DOTALL),
    "DescribeQueryCommand": re.compile(rf"{_TRIVIA}(?P<keyword>DESC(?:RIBE)?)\b{_TRIVIA}(?P<mode>QUERY\b)?",
                                       re.IGNORECASE | re.DOTALL),
}
# The first word of each allowed kind (and "(" of a parenthesized query).
STARTS = frozenset({"SELECT", "WITH", "VALUES", "TABLE", "FROM", "(", "SHOW", "DESC", "DESCRIBE", "EXPLAIN"})

# Spark's names for the statements users meet most, as the SQL that makes them.
KINDS = {
    "InsertIntoStatement": "INSERT", "InsertIntoDir": "INSERT OVERWRITE DIRECTORY", "RestoreTableStatement": "RESTORE",
    "DeltaReorgTable": "REORG", "ConvertToDeltaCommand": "CONVERT TO DELTA", "OptimizeTableCommand": "OPTIMIZE",
    "VacuumTableCommand": "VACUUM", "DeltaGenerateCommand": "GENERATE", "CreateTable": "CREATE TABLE",
    "CreateTableAsSelect": "CREATE TABLE ... AS SELECT", "ReplaceTable": "REPLACE TABLE",
    "ReplaceTableAsSelect": "REPLACE TABLE ... AS SELECT", "CreateViewCommand": "CREATE VIEW",
    "CreateView": "CREATE VIEW", "CreateFunctionCommand": "CREATE FUNCTION", "CreateNamespace": "CREATE DATABASE",
    "CreateVariable": "DECLARE VARIABLE", "DropTable": "DROP TABLE", "DropView": "DROP VIEW",
    "DropNamespace": "DROP DATABASE", "DropFunction": "DROP FUNCTION", "CacheTable": "CACHE TABLE",
    "CacheTableAsSelect": "CACHE TABLE", "UncacheTable": "UNCACHE TABLE", "ClearCacheCommand$": "CLEAR CACHE",
    "SetCommand": "SET", "ResetCommand": "RESET", "SetVariable": "SET VARIABLE", "SetCatalogAndNamespace": "USE",
    "AddJarsCommand": "ADD JAR", "AddFilesCommand": "ADD FILE", "AddArchivesCommand": "ADD ARCHIVE",
    "MergeIntoTable": "MERGE", "UpdateTable": "UPDATE", "DeleteFromTable": "DELETE", "TruncateTable": "TRUNCATE",
    "CloneTableStatement": "CLONE", "RefreshTable": "REFRESH TABLE", "RepairTable": "MSCK REPAIR TABLE",
    "AnalyzeTable": "ANALYZE TABLE", "LoadData": "LOAD DATA", "Call": "CALL", "CompoundBody": "a SQL script",
    "UnresolvedExecuteImmediate": "EXECUTE IMMEDIATE", "ScriptTransformation": "SELECT TRANSFORM (it runs a program)",
    "PlanWithUnresolvedIdentifier": "a table named by IDENTIFIER(<expression>)",
    "CreateSQLFunctionCommand": "CREATE FUNCTION", "CreateUserDefinedFunction": "CREATE FUNCTION",
    "DropVariable": "DROP VARIABLE", "SetCatalogCommand": "SET CATALOG", "RefreshResource": "REFRESH",
    "RefreshFunction": "REFRESH FUNCTION", "AnalyzeTables": "ANALYZE TABLES", "AnalyzeColumn": "ANALYZE TABLE",
    "ListFilesCommand": "LIST FILE", "ListJarsCommand": "LIST JAR", "ListArchivesCommand": "LIST ARCHIVE",
    "SetTableProperties": "ALTER TABLE", "UnsetTableProperties": "ALTER TABLE", "AddColumns": "ALTER TABLE",
    "NamedStreamingRelation": "a streaming read (STREAM)", "ExplainCommand": "EXPLAIN",
    "DescribeQueryCommand": "DESCRIBE QUERY",
}
# Functions that reach past the query's rows, and where to.
# An option's key may be computed (map(lower('ROWVALIDATIONXSDPATH'), ...)): those functions are refused outright.
_JVM, _XSD, _AVRO = ("calls Java methods in Spark's JVM", "reads the XSD file its rowValidationXSDPath option names",
                     "reads the schema file its avroSchemaUrl option names")
FUNCTIONS = {"java_method": _JVM, "reflect": _JVM, "try_reflect": _JVM,
             "from_protobuf": "reads a descriptor file", "to_protobuf": "reads a descriptor file",
             "from_xml": _XSD, "schema_of_xml": _XSD, "from_avro": _AVRO, "schema_of_avro": _AVRO}
_NAMES = "|".join(FUNCTIONS)
_CALL_TYPED = re.compile(rf"(?<![\w$])`?({_NAMES})`?\s*\(", re.IGNORECASE)  # in the text as typed
_NAMED = re.compile(rf"(?<![\w$])({_NAMES}|IDENTIFIER)(?![\w$])", re.IGNORECASE)  # anywhere: a call or not
_CALL_PARSED = re.compile(rf"(?<![\w$])({_NAMES})\(|UnresolvedTableValuedFunction \[(?:[^\]]*, )?({_NAMES})\]",
                          re.IGNORECASE)  # in a parsed plan: 'name( or a table function's [name]
_DYNAMIC_CALL = "expressionwithunresolvedidentifier("  # a function named by IDENTIFIER(<expression>)
_RELATION = re.compile(r"Unresolved(?:Relation|TableOrView|Table|View|Identifier) \[([^\]]*)\]")
FILE_FORMATS = {"parquet", "json", "csv", "text", "orc", "avro", "binaryfile", "xml", "hive", "jdbc", "libsvm"}
_FIRST = re.compile(r"'?([A-Za-z_][\w$]*)")
_CHILD = re.compile(r"(?::  |   )*[:+]- '?([A-Za-z_][\w$]*)")  # a child's line: its tree prefix, then its name
_TRUNCATED = re.compile(r"\.\.\. \d+ more (?:fields|characters)")
_ALL_FIELDS = 2**31 - 1

# delta-spark's lexer before the first token: whitespace, `--` and (not nested) `/* */` comments
_DELTA_TRIVIA = re.compile(r"(?:[ \r\n\t]+|--[^\r\n]*\r?\n?|/\*.*?\*/)*", re.DOTALL)
# DESCRIBE HISTORY/DETAIL in delta-spark's grammar (a LIMIT or a quoted path, which Spark's grammar
# under EXPLAIN does not parse): both only read the table's log
_DELTA_DESCRIBE = re.compile(r"\s*DESC(?:RIBE)?\s+(?:HISTORY|DETAIL)\s+(?:\w+|`[^`]+`|`?delta`?\.`[^`]+`|'[^'\\]*')"
                             r"(?:\s+LIMIT\s+\d+)?[\s;]*", re.IGNORECASE)


def refuse(found: str) -> LaminarError:
    """The one-line error for a statement `laminar sql` does not run, naming what it found."""
    return LaminarError(f"`laminar sql` reads only: it runs {ALLOWED}; found {found} (nothing ran)")


def check_text(text: str, *, anywhere: bool = False) -> None:
    """Refuse the functions of `FUNCTIONS` by their plain names, from the text alone (no Spark needed:
    `run_query` calls it before starting a session). `check_read_only` judges the parse. `anywhere`
    (over Spark Connect, whose EXPLAIN optimizes the statement before its parse is judged): refuse those
    names, and IDENTIFIER, wherever they appear, a comment between a name and its "(" included."""
    if anywhere and (word := _NAMED.search(text)):
        name = word.group(1).lower()
        if name == "identifier":
            raise refuse("IDENTIFIER(...), which over Spark Connect names a table or function only when Spark "
                         "analyzes the statement, after the guard's EXPLAIN")
        raise refuse(f"function {name}, which {FUNCTIONS[name]}")
    if call := _CALL_TYPED.search(text):
        name = call.group(1).lower()
        raise refuse(f"function {name}, which {FUNCTIONS[name]}")


def check_read_only(spark, text: str, *, shown: Callable[[str], str] = lambda line: f"query failed: {line}",
                    schemas: frozenset[str] = frozenset()) -> str:
    """Raise a one-line LaminarError unless `text` is one statement of an allowed kind that reads only
    tables by name or Delta tables by path and calls none of `FUNCTIONS`; run nothing. A syntax error
    is Spark's own message, first line, through `shown` (positions as in `text`). Return the statement
    to run: `text`, or over Spark Connect an EXPLAIN / DESCRIBE QUERY rebuilt around the statement it
    judged (`_wrapped`), as long as `text`, so Spark's positions still point into it. `schemas`: catalog
    schemas whose tables a query may name (`laminar.vwap_1m`: the lake's own tables, registered by Laminar)."""
    remote = getattr(spark, "_jsparkSession", None) is None  # a Spark Connect session: no JVM handle
    check_text(text, anywhere=remote)
    if remote:
        first = first_word(text)
        if first not in STARTS:
            raise refuse(_unparsed(first))
        if _DELTA_DESCRIBE.fullmatch(text):
            return text  # delta-spark's DESCRIBE HISTORY/DETAIL: it reads the table's log
    try:
        plan = None if remote else _parse(spark, text)
        tree = _explained(spark, text) if remote else _tree(plan)
    except ParseException as exc:
        first = first_word(text)
        if first in STARTS and _several(text):
            raise refuse("several statements") from None
        if first not in STARTS:
            raise refuse(_unparsed(first)) from None
        raise LaminarError(shown(spark_error_line(exc, lines_before=1 if remote else 0))) from None
    return judge(spark, text, tree, plan=plan, shown=shown, schemas=schemas)


def judge(spark, text: str, tree: str, *, plan=None, shown: Callable[[str], str],
          schemas: frozenset[str] = frozenset()) -> str:
    """Judge a parsed plan as Spark prints it (`treeString`: one node a line, children under `+- `/`:- `);
    `plan` is the local parser's plan itself (None over Spark Connect). Return the statement to run."""
    if _TRUNCATED.search(tree):
        raise refuse("a statement too long to judge (Spark shortened its plan)")
    lines = tree.splitlines() or [""]
    first = _FIRST.match(lines[0])
    root = first.group(1) if first else lines[0][:40]
    if root in WRAPPERS:
        return _wrapped(spark, text, root, plan, shown=shown, schemas=schemas)
    if root not in QUERY_NODES | SHOW_DESCRIBE:
        raise refuse(_kind(root))
    for line in lines[1:]:
        if (node := _CHILD.match(line)) and node.group(1) not in _BELOW_ROOT:
            raise refuse(_kind(node.group(1)))  # (a string literal's own lines rarely look like nodes)
    if _DYNAMIC_CALL in tree:
        raise refuse("a function named by IDENTIFIER(<expression>)")
    if call := _CALL_PARSED.search(tree):
        name = (call.group(1) or call.group(2)).lower()
        raise refuse(f"function {name}, which {FUNCTIONS[name]}")
    for parts in (m.group(1).split(", ") for m in _RELATION.finditer(tree)):
        if len(parts) > 1 and not (len(parts) == 2 and parts[0].lower() == "delta") and \
                not (len(parts) == 2 and parts[0].lower() in schemas):  # delta.`/path`: its snapshot
            raise refuse_name(parts)
    return text


def _wrapped(spark, text: str, root: str, plan, *, shown: Callable[[str], str],
             schemas: frozenset[str] = frozenset()) -> str:
    """EXPLAIN / DESCRIBE QUERY only plans or analyzes the statement it wraps: judge that one. Locally the
    plan holds it as Spark parsed it. Over Spark Connect it is cut from the text after the keywords, and
    what runs is the keywords (at their places, the rest of the head blanked) and the statement judged:
    a comment that Spark's lexer ends elsewhere than `_TRIVIA` can only break the statement, not hide one."""
    if plan is not None:
        inner = plan.logicalPlan() if root == "ExplainCommand" else plan.plan()
        judge(spark, "", _tree(inner), plan=inner, shown=shown, schemas=schemas)
        return text
    head = WRAPPERS[root].match(text)
    if head is None:
        raise refuse(f"{_kind(root)} whose statement the guard could not find")
    statement = check_read_only(spark, text[head.end():], shown=shown, schemas=schemas)
    rebuilt = [c if c in "\r\n" else " " for c in text[:head.end()]]
    for group in ("keyword", "mode"):
        if head.group(group):
            rebuilt[head.start(group):head.end(group)] = head.group(group)
    return "".join(rebuilt) + statement


def refuse_name(parts: list[str]) -> LaminarError:
    """The error for a table name of several parts other than delta.`/path`: a file read by format
    (e.g. parquet.`/path`) or a table of another catalog or database."""
    why = (f"{parts[0]}.`{parts[1]}`, which reads files without a Delta log (a Delta table's folder holds "
           "removed files too): name the table, or read it as delta.`/path`"
           if len(parts) == 2 and parts[0].lower() in FILE_FORMATS else
           f"{'.'.join(parts)}, a table of another catalog or database")
    return LaminarError(f"`laminar sql` reads the lake's tables by name and Delta tables by path (delta.`/path`); "
                        f"found {why}")


def _parse(spark, text: str):
    """A local session's own parser's plan of `text` (delta-spark's parser when loaded): a JVM object."""
    return spark._jsparkSession.sessionState().sqlParser().parsePlan(text)


def _tree(plan) -> str:
    """A parsed plan as Spark prints it, all fields of every node."""
    return plan.treeString(True, False, _ALL_FIELDS, False, False)  # verbose, no suffix, fields, no ids/columns


# Session settings while the guard's EXPLAIN runs over Spark Connect: print every field of a node (25 by
# default), and resolve no `<format>.`/path`` read (analysis would list and read the files).
_EXPLAIN_SETTINGS = {"spark.sql.debug.maxToStringFields": str(_ALL_FIELDS), "spark.sql.runSQLOnFiles": "false"}


def _explained(spark, text: str) -> str:
    """The parsed plan `EXPLAIN EXTENDED` prints over Spark Connect (the statement itself is not run)."""
    before = {key: spark.conf.get(key, None) for key in _EXPLAIN_SETTINGS}
    for key, value in _EXPLAIN_SETTINGS.items():
        spark.conf.set(key, value)
    try:
        out = "\n".join(row[0] for row in spark.sql("EXPLAIN EXTENDED\n" + text).collect())
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    head, marker = "== Parsed Logical Plan ==\n", "\n== Analyzed Logical Plan =="
    if not out.startswith(head):  # "Error occurred during query planning:", then why: nothing to judge
        why = [x.strip() for x in out.splitlines() if x.strip() and not x.startswith("Error occurred during query")]
        raise LaminarError(f"query failed: {why[0] if why else out.strip() or 'EXPLAIN printed nothing'}")
    if out.count(marker) != 1:  # a string literal holding the marker: where the parsed plan ends is unclear
        raise refuse("a statement whose text holds EXPLAIN's own section headers")
    return out[len(head):out.index(marker)].rstrip("\n")


def first_word(text: str) -> str:
    """The first word of `text` in upper case (or "(" / the first character), as delta-spark's lexer
    reads it: after whitespace, `--` comments and `/* */` comments (which it does not nest)."""
    trivia = _DELTA_TRIVIA.match(text)
    assert trivia is not None  # a pattern of `(...)*`: it matches every text, if only emptily
    rest = text[trivia.end():]
    word = re.match(r"[A-Za-z0-9_]+", rest)
    return word.group(0).upper() if word else rest[:1] or "nothing"


def _several(text: str) -> bool:
    """Whether a statement Spark did not parse is several, `;`-separated (sqlglot's tokens: not a `;`
    in a string literal or a comment)."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except SqlglotError:
        return False
    kinds = [t.token_type.name for t in tokens]
    while kinds and kinds[-1] == "SEMICOLON":
        kinds.pop()
    return "SEMICOLON" in kinds


def _unparsed(first: str) -> str:
    """What a statement Spark's grammar does not parse (here) is, by its first word: e.g. "RESTORE ..."."""
    return "nothing" if first == "nothing" else f"{first} ..."


def _kind(node: str) -> str:
    """What a plan node is, as the SQL that makes it (ALTER TABLE for each of delta's Alter* nodes too)."""
    if node.startswith("AlterTable"):
        return "ALTER TABLE"
    return KINDS.get(node, f"{node} (Spark's name for the statement)")


def spark_error_line(exc: Exception, *, lines_before: int = 0) -> str:
    """Spark's message, first line only (no plan, no JVM trace); `lines_before` lines that Laminar put
    before the text are taken off its `(line N, pos M)`."""
    java = getattr(exc, "java_exception", None)  # a Py4JJavaError Spark did not convert
    text = str(java.toString()) if java is not None else str(exc)
    line = next((x.strip() for x in text.splitlines() if x.strip()), type(exc).__name__).rstrip(";")
    if lines_before:
        line = re.sub(r"\(line (\d+), pos (\d+)\)", lambda m: f"(line {int(m.group(1)) - lines_before}, pos {m.group(2)})",
                      line)
    return line
