"""CREATE SINK statements of `.sql` flow files, compiled to export specs.

    CREATE SINK name FROM <flow or stage> INTO POSTGRES | REDIS | WEBHOOK
      [COMMENT 'what it delivers']
      [WITH (connection = 'analytics', table = 'public.vwap_1m', ...)]   -- connection is required

The WITH options are the export kind's own fields (`PostgresExport.table`, `WebhookExport.retractions`, ...),
plus `owners` ('team:x, a@b.c') and `tags` ('domain:trades, tier:gold') as for views. sqlglot parses no
CREATE SINK, so these statements are read from its tokens here; `views.compile_sql_definitions` takes them
out of the file before sqlglot parses the views. Every error is a `SqlDefinitionError` naming the file, the
line and the construct.
"""

from __future__ import annotations

from dataclasses import fields
from typing import NoReturn

from laminar_assets.errors import SpecError, SqlDefinitionError

from ..spec.exports import EXPORT_KINDS, ExportSpec

_WORDS = ("VAR", "IDENTIFIER")  # a name; keywords (TABLE, FROM, ...) are accepted as option names only


def is_sink(tokens: list) -> bool:
    """Whether a statement's tokens start with CREATE SINK."""
    return len(tokens) >= 2 and tokens[0].token_type.name == "CREATE" and tokens[1].text.upper() == "SINK"


def compile_sink(tokens: list, text: str, origin: str) -> ExportSpec:
    """The export one CREATE SINK statement (`tokens`, its original `text`) defines."""
    line = tokens[0].line
    at = [2]  # the next token to read
    name: str | None = None

    def fail(token, message: str) -> NoReturn:
        where = token.line if token is not None else line
        construct = token.text if token is not None else None
        sink = f" in sink {name!r}" if name else ""
        raise SqlDefinitionError(f"{origin}:{where}{sink}: {message} (at: {construct or 'end of statement'})",
                                 file=origin, line=where, construct=construct, flow=name or "?")

    def peek():
        return tokens[at[0]] if at[0] < len(tokens) else None

    def take(what: str, *, kinds=_WORDS, word: str | None = None):
        tok = peek()
        if tok is None or (word is not None and tok.text.upper() != word) or (word is None and tok.token_type.name not in kinds):
            fail(tok, f"expected {what}; the statement reads CREATE SINK <name> FROM <flow or stage> INTO "
                      f"{' | '.join(k.upper() for k in EXPORT_KINDS)} [COMMENT '...'] [WITH (connection = '...', ...)]")
        at[0] += 1
        return tok

    name = take("the sink's name").text
    take("FROM", word="FROM")
    source = take("the name of the flow or stage it delivers").text
    take("INTO", word="INTO")
    kind_token = take("the kind of target", kinds=(*_WORDS, "TABLE"))
    kind = EXPORT_KINDS.get(kind_token.text.lower())
    if kind is None:
        fail(kind_token, f"unknown kind of target {kind_token.text!r}; expected one of "
                         f"{', '.join(k.upper() for k in EXPORT_KINDS)}")
    values: dict = {}
    if peek() is not None and peek().text.upper() == "COMMENT":
        at[0] += 1
        values["description"] = take("a string after COMMENT", kinds=("STRING",)).text
    options: dict[str, object] = {}
    if peek() is not None and peek().token_type.name == "WITH":
        at[0] += 1
        take("( after WITH", kinds=("L_PAREN",))
        while True:
            key = peek()
            if key is None or key.token_type.name in ("STRING", "NUMBER", "L_PAREN", "R_PAREN", "COMMA", "EQ"):
                fail(key, "expected an option name")
            at[0] += 1
            option = key.text.lower()
            take(f"= after option {option!r}", kinds=("EQ",))
            value = take(f"a string or number for option {option!r}", kinds=("STRING", "NUMBER"))
            if option in options:
                fail(key, f"option {option!r} is given twice")
            options[option] = value.text if value.token_type.name == "STRING" else _number(value.text)
            after = take("',' or ')'", kinds=("COMMA", "R_PAREN"))
            if after.token_type.name == "R_PAREN":
                break
    if peek() is not None:
        fail(peek(), "unexpected text after the sink's definition")
    allowed = ("connection", "owners", "tags", *kind.option_names())
    for option, value in options.items():
        if option not in allowed:
            fail(next(t for t in tokens if t.text.lower() == option), f"unknown option {option!r} for a "
                 f"{kind.kind.upper()} sink; expected one of {', '.join(allowed)}")
        if option == "owners":
            values["owners"] = tuple(o.strip() for o in str(value).split(",") if o.strip())
        elif option == "tags":
            values["tags"] = tuple(tuple(p.strip() for p in t.split(":", 1)) for t in str(value).split(",") if t.strip())
        else:
            values[option] = _typed(kind, option, value)
    if "connection" not in values:
        fail(None, f"a sink needs WITH (connection = '<name>'): the connection its {kind.kind} target is reached "
                   "through (defined by the Dagster resource or LAMINAR_CONNECTION_<NAME>_URL)")
    try:
        return kind(name=name, source=source, origin=f"{origin}:{line}", definition=text, **values)
    except SpecError as exc:
        raise SqlDefinitionError(f"{origin}:{line}: sink {name!r}: {exc.message}", file=origin, line=line,
                                 construct=exc.field, flow=name, field=exc.field) from None


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _typed(kind: type[ExportSpec], option: str, value):
    """A number given as a string where the field wants one ('100' for batch_rows) becomes the number; the
    spec says what it expected of anything else."""
    annotation = str(next(f.type for f in fields(kind) if f.name == option))
    if isinstance(value, str) and ("int" in annotation or "float" in annotation):
        try:
            return _number(value)
        except ValueError:
            return value
    return value
