"""Commits whose files hold a column under another type than the table has now.

A Delta table's schema changes with a metaData action in its log: an overwrite with a
new schema (`overwriteSchema`, delta-rs `schema_mode="overwrite"`) may retype a column
(price double -> string) and a later one restore it. A run reads every file with the
schema it pins (the latest), and Spark cannot read a file that stores the column under
another type (FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH): a run merging such a
commit, or a sweep reading it, would fail on every run, since the commit stays in the
history it reads. These commits are found in the log before Spark reads anything, so the
planner refills from the latest snapshot instead (SCHEMA_CHANGED_HISTORY) and the sweep
sweeps that snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from laminar_assets.errors import LaminarError

from .log import CommitSummary, read_log_entry

# nullability never stops a read; a nested field's metadata (comments, column-mapping ids) neither
_IGNORED = frozenset({"nullable", "containsNull", "valueContainsNull", "metadata"})


def column_types(schema_json: str) -> dict[str, str]:
    """Each top-level column (lower-cased: Spark resolves names regardless of case) -> its Delta type,
    as text ("double", "decimal(10,2)", or canonical JSON for a nested type)."""
    fields = json.loads(schema_json).get("fields") or []
    return {f["name"].lower(): _type_text(f["type"]) for f in fields}


def _type_text(typ) -> str:
    return typ if isinstance(typ, str) else json.dumps(_bare(typ), sort_keys=True, separators=(",", ":"))


def _bare(value):
    if isinstance(value, dict):
        return {k: _bare(v) for k, v in value.items() if k not in _IGNORED}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


def short_type(text: str) -> str:
    """A type as `column_types` gives it, for a message: a nested type by its outer kind."""
    if not text.startswith("{"):
        return text
    return json.loads(text).get("type", "nested")


_FAMILIES = {**dict.fromkeys(("byte", "short", "integer", "long", "float", "double", "decimal"), "numeric"),
             **dict.fromkeys(("string", "varchar", "char"), "string"),
             **dict.fromkeys(("timestamp", "timestamp_ntz", "date"), "temporal")}


def type_family(text: str) -> str:
    """The family of a type as `column_types` gives it: numeric (byte..decimal), string (string,
    varchar, char), temporal (timestamp, timestamp_ntz, date), or the type's own outer kind (boolean,
    binary, struct, array, map, ...). Within a family an expression reads a value alike (a wider
    number, another precision); across families Spark casts implicitly or fails, row by row."""
    kind = short_type(text).split("(", 1)[0].strip().lower()
    return _FAMILIES.get(kind, kind)


def _in_effect(commits: Collection[CommitSummary], start_schema):
    """Each commit (in version order) with the column types of the schema in effect at its version (its
    own metaData's, else the last one's before it, else `start_schema()`'s, asked once and only when a
    commit precedes the first change; None when unknown)."""
    then: dict[str, str] | None = None
    asked = False
    for c in commits:
        if c.schema:
            then = column_types(c.schema)
        elif then is None and not asked:
            asked = True
            try:
                start = start_schema()
            except LaminarError:  # that snapshot cannot be opened (log cleaned up): the history says so
                start = None
            then = column_types(start) if start else None
        yield c, then


def _wanted(now: Mapping[str, str], columns: Collection[str]) -> set[str]:
    return set(now) if "*" in columns else {c.lower() for c in columns} & set(now)


def retyped_commits(table: str, commits: Collection[CommitSummary], now_schema: str | None, columns: Collection[str],
                    start_schema) -> tuple[tuple[int, str], ...]:
    """(version, why) of each commit in `commits` (in version order) that adds data or change data
    files written while a column in `columns` ("*": all) had another type than in `now_schema` (the
    Delta schema JSON the reader reads with). `start_schema()`: the schema before the first commit,
    asked for only when some commit changed the schema and an earlier one exists; None when
    unknown: the commits before the first change are then not named (a failed read still is caught)."""
    if now_schema is None or not any(c.schema for c in commits):
        return ()  # no schema change in the range: every file has the schema the reader has
    now = column_types(now_schema)
    wanted = _wanted(now, columns)
    out = []
    for c, then in _in_effect(commits, start_schema):
        if then is None or not (c.adds or c.cdc):
            continue
        differ = sorted(col for col in wanted if col in then and then[col] != now[col])
        if differ:
            col = differ[0]
            out.append((c.version, f"commit {c.version} of '{table}' holds files with column {col!r} as "
                                   f"{short_type(then[col])}, which the table now has as {short_type(now[col])}; those files "
                                   "cannot be read with the current schema"))
    return tuple(out)


def foreign_versions(commits: Collection[CommitSummary], now_schema: str | None, columns: Collection[str],
                     start_schema) -> tuple[int, ...]:
    """The versions of `commits` at which the schema in effect has a column in `columns` ("*": all)
    under another type family than `now_schema` has it (price text between a double and a double
    again). A reader pinned at such a version reads the column as that version's schema says, and the
    spec's expressions, written for today's type, cast it row by row or fail (`px > 0` over text):
    a bounded run does not stop at one. `start_schema` as for `retyped_commits`."""
    if now_schema is None or not any(c.schema for c in commits):
        return ()
    now = column_types(now_schema)
    wanted = _wanted(now, columns)
    return tuple(c.version for c, then in _in_effect(commits, start_schema) if then is not None
                 and any(col in then and type_family(then[col]) != type_family(now[col]) for col in wanted))


# How far back `restored` reads the log (entries are small; this bounds a refused run's reads).
MAX_WALK = 1000


def restored(table: str, uri: str, column: str, version: int, then: str, now: str,
             known: Mapping[int, str | None]) -> bool:
    """Whether column `column` (lower-case), of type family `then` at `version` and `now` today, was
    restored: it was created with `now`, so `then` was an interlude, however many times the producer
    switched between the two since (a spec is written for the type its column was created with). Read
    from the schemas the log's metaData actions set, walking back from `version` to the column's first
    version (at most `MAX_WALK` entries; `known`: version -> the schema JSON a commit already read set,
    or None). False when the log does not tell (an entry gone, or the walk's end reached first)."""
    first: str | None = None  # the family of the earliest schema seen so far that has the column
    for v in range(version, max(-1, version - MAX_WALK), -1):
        if v in known:
            schema = known[v]
        else:
            text = read_log_entry(table, uri, v)
            if text is None:
                return False
            schema = _schema_set(text)
        if schema is not None:
            types = column_types(schema)
            if column not in types:  # created after this version, with the type seen last
                return first == now
            first = type_family(types[column])
        if v == 0:
            return first == now
    return False


def _schema_set(entry: str) -> str | None:
    """The schema a log entry's metaData action sets, or None (only those lines are parsed)."""
    for line in entry.splitlines():
        if '"metaData"' in line:
            meta = json.loads(line).get("metaData")
            if meta and meta.get("schemaString"):
                return meta["schemaString"]
    return None
