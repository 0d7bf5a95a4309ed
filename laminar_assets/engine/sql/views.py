"""`.sql` files of CREATE MATERIALIZED VIEW statements, compiled to flow and stage specs.

    CREATE MATERIALIZED VIEW name
      [PARTITIONED BY HOUR | DAY]                      -- default HOUR
      [COMMENT 'what it holds']                        -- the asset's description
      [WITH (refresh = 'auto' | 'incremental_strict' | 'full', target_lag = '5m', start = '2026-11-01', ...)]
    AS SELECT ...;

A SELECT grouped by TUMBLE or HOP is a flow, one without GROUP BY is a stage (`select.py` maps
the select list). Parsing is sqlglot's (Spark dialect). Every error is a `SqlDefinitionError` (a
`SpecError`) that names the file, the line and the construct. The same files may hold CREATE SINK
statements (exports, `sinks.py`): `compile_sql_definitions` returns both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NoReturn

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token

from laminar_assets.errors import SpecError, SqlDefinitionError

from ..spec.exports import ExportSpec
from ..spec.parts import LatePolicy
from ..spec.specs import FlowSpec, Spec, StageSpec
from .select import DIALECT, flow_fields
from .sinks import compile_sink, is_sink
from .stage_select import stage_fields

# WITH (...) options: name -> the spec field it sets (values are strings or numbers)
OPTIONS = ("refresh", "target_lag", "owners", "tags", "freeze_after", "max_versions_per_run", "max_rows_per_run",
           "event_time", "sink", "start")
_PARTITIONING = {"HOUR": "hourly", "HOURLY": "hourly", "DAY": "daily", "DAILY": "daily"}


def compile_sql_file(path: str | os.PathLike) -> list[Spec]:
    """Every view of one `.sql` file, as specs (in file order); its sinks: `read_sql_file`."""
    return read_sql_file(path)[0]


def read_sql_file(path: str | os.PathLike) -> tuple[list[Spec], list[ExportSpec]]:
    """Every view of one `.sql` file as specs, and every sink as exports (each in file order)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    rel = os.path.relpath(path)
    return compile_sql_definitions(text, origin=str(path) if rel.startswith("..") else rel)


def compile_sql_definitions(text: str, *, origin: str = "<sql>") -> tuple[list[Spec], list[ExportSpec]]:
    """The specs that the CREATE MATERIALIZED VIEW statements of `text` define, and the exports its CREATE
    SINK statements define; `origin` names the file. The sinks are compiled from their tokens and blanked out
    of the text (newlines kept, so sqlglot's line numbers stay those of the file) before the views parse."""
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError as exc:
        raise SqlDefinitionError(f"{origin}: the SQL does not tokenize: {exc}", file=origin, line=None) from None
    exports, kept = [], list(text)
    for statement in _statements(tokens):
        if is_sink(statement):
            start, end = statement[0].start, statement[-1].end + 1
            exports.append(compile_sink(statement, text[start:end].strip(), origin))
            stop = end + 1 if end < len(text) and text[end] == ";" else end
            kept[start:stop] = [c if c == "\n" else " " for c in text[start:stop]]
    rest = "".join(kept) if exports else text
    return (compile_sql(rest, origin=origin) if rest.strip() else []), exports


def compile_sql(text: str, *, origin: str = "<sql>") -> list[Spec]:
    """The specs that the CREATE MATERIALIZED VIEW statements of `text` define; `origin` names the file.
    (A text with CREATE SINK statements: `compile_sql_definitions`.)"""
    try:
        statements = [s for s in sqlglot.parse(text, read=DIALECT) if s is not None]
    except ParseError as exc:
        e = exc.errors[0] if exc.errors else {}
        line = e.get("line")
        raise SqlDefinitionError(f"{origin}:{line}: the SQL does not parse: {e.get('description', exc)} "
                                 f"(near {e.get('highlight', '?')!r})", file=origin, line=line,
                                 construct=e.get("highlight")) from None
    except TokenError as exc:
        raise SqlDefinitionError(f"{origin}: the SQL does not tokenize: {exc}", file=origin, line=None) from None
    texts: Sequence[tuple[int | None, str]] = _statement_texts(text)  # (no first line: written back by sqlglot)
    if len(texts) != len(statements):
        texts = [(None, s.sql(dialect=DIALECT, pretty=True)) for s in statements]
    return [_compile(stmt, origin, line, body) for stmt, (line, body) in zip(statements, texts)]


def _compile(stmt: exp.Expr, origin: str, start: int | None, body: str) -> Spec:
    name = stmt.this.name if isinstance(stmt, exp.Create) and isinstance(stmt.this, exp.Table) else None

    def fail(node: exp.Expr | None, message: str) -> NoReturn:
        line = _line(node) or start
        construct = node.sql(dialect=DIALECT)[:120] if node is not None else None
        where = f" in view {name!r}" if name else ""
        raise SqlDefinitionError(f"{origin}:{line}{where}: {message} (at: {construct})", file=origin, line=line,
                                 construct=construct, flow=name or "?")

    props = stmt.args.get("properties")
    is_mv = isinstance(stmt, exp.Create) and (stmt.args.get("kind") or "").upper() == "VIEW" and props is not None \
        and any(isinstance(p, exp.MaterializedProperty) for p in props.expressions)
    if not is_mv or not name or props is None:  # (is_mv has props)
        fail(stmt, "expected CREATE MATERIALIZED VIEW <name> AS SELECT ...")
    select = stmt.expression
    if not isinstance(select, exp.Select):
        fail(select, "the view's query must be one SELECT (no UNION; define each part as its own view)")
    common: dict = {"partitioning": "hourly"}
    options: dict[str, str] = {}
    for p in props.expressions:
        if isinstance(p, exp.MaterializedProperty):
            continue
        if isinstance(p, exp.PartitionedByProperty):
            unit = p.this.name.upper() if isinstance(p.this, (exp.Identifier, exp.Column, exp.Var)) else ""
            if unit not in _PARTITIONING:
                fail(p, "expected PARTITIONED BY HOUR or PARTITIONED BY DAY")
            common["partitioning"] = _PARTITIONING[unit]
        elif isinstance(p, exp.SchemaCommentProperty):
            common["description"] = p.this.name
        elif isinstance(p, exp.SequenceProperties) and set(p.args) == {"start"}:
            options["start"] = p.args["start"].name  # sqlglot reads `start = ...` as a sequence's START WITH
        elif isinstance(p, exp.Property) and p.name.lower() in OPTIONS:
            options[p.name.lower()] = p.args["value"].name
        elif isinstance(p, exp.Property):
            fail(p, f"unknown option {p.name!r}; expected one of {', '.join(OPTIONS)}")
        else:
            fail(p, "unsupported clause; expected PARTITIONED BY, COMMENT or WITH (...)")
    common.update(_option_fields(options))
    grouped = select.args.get("group") is not None
    if grouped and "event_time" in options:
        fail(stmt, "a flow's event time is its window's time column; drop WITH (event_time = ...)")
    fields = flow_fields(select, fail) if grouped else \
        stage_fields(select, fail, event_time=options.get("event_time", "event_time"))
    try:
        cls = FlowSpec if grouped else StageSpec
        return cls(name=name, origin=f"{origin}:{start}" if start else origin, definition=body, **common, **fields)
    except SpecError as exc:
        raise SqlDefinitionError(f"{origin}:{start}: view {name!r}: {exc.message}", file=origin, line=start,
                                 construct=exc.field, flow=name, field=exc.field) from None


def _option_fields(options: dict[str, str]) -> dict:
    out: dict = {}
    for key in ("refresh", "target_lag", "sink", "start"):
        if key in options:
            out[key] = options[key]
    if "owners" in options:
        out["owners"] = tuple(o.strip() for o in options["owners"].split(",") if o.strip())
    if "tags" in options:  # 'domain:trades, tier:gold'
        out["tags"] = tuple(tuple(part.strip() for part in t.split(":", 1)) for t in options["tags"].split(",") if t.strip())
    if "freeze_after" in options:
        out["late"] = LatePolicy(freeze_after=options["freeze_after"])
    for key in ("max_versions_per_run", "max_rows_per_run"):
        if key in options:
            out[key] = int(options[key]) if options[key].isdigit() else options[key]
    return out


def _line(node: exp.Expr | None) -> int | None:
    """The first source line of a parsed node (sqlglot keeps positions on identifiers and functions)."""
    if node is None:
        return None
    lines = [n.meta["line"] for n in node.walk() if isinstance(n, exp.Expression) and "line" in n.meta]
    return min(lines) if lines else None


def _statements(tokens: list) -> list[list]:
    """The tokens of each statement, split at semicolons."""
    out: list[list] = []
    current: list = []
    for tok in tokens:
        if tok.token_type.name == "SEMICOLON":
            if current:
                out.append(current)
            current = []
        else:
            current.append(tok)
    return [*out, current] if current else out


def _statement_texts(text: str) -> list[tuple[int, str]]:
    """(first line, original text) of each statement, split where the tokenizer sees a semicolon."""
    tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    out: list[tuple[int, str]] = []
    current: list[Token] = []
    for tok in [*tokens, None]:
        if tok is None or tok.token_type.name == "SEMICOLON":
            if current:
                out.append((current[0].line, text[current[0].start:current[-1].end + 1].strip()))
            current = []
        else:
            current.append(tok)
    return out
