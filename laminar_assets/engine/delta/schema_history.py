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

import pyarrow as pa

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
            then = _start_types(start_schema)
        yield c, then


def _start_types(start_schema) -> dict[str, str] | None:
    """The column types of `start_schema()` (the schema before a range of commits), or None when unknown
    (that snapshot cannot be opened, e.g. its log was cleaned up: the history then says so)."""
    try:
        start = start_schema()
    except LaminarError:
        return None
    return column_types(start) if start else None


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


def widened_commits(table: str, commits: Collection[CommitSummary], columns: Collection[str],
                    start_schema) -> tuple[tuple[int, str], ...]:
    """(version, why) of each commit in `commits` (in version order) whose metaData changed the type of a
    column in `columns` ("*": all) in place, to a type Delta's type widening allows (`widens`: int ->
    bigint, float -> double, a wider decimal, ...), from the schema in effect before it (the previous
    commit's, else `start_schema()`'s, asked once and only when needed). Such a column reads the same
    values under the new type, but the state a partition built before the change holds what the spec's
    expressions computed with the old one (float arithmetic, an int's range): the planner refills it
    (SCHEMA_CHANGED) instead of merging rows read with the new type into it."""
    if not any(c.schema for c in commits):
        return ()
    out = []
    then: dict[str, str] | None = None
    asked = False
    for c in commits:
        if not c.schema:
            continue
        now = column_types(c.schema)
        if then is None and not asked:
            asked = True
            then = _start_types(start_schema)
        if then is not None:
            for col in sorted(_wanted(now, columns)):
                if col in then and then[col] != now[col] and _widened(then[col], now[col]):
                    out.append((c.version, f"column {col!r} of '{table}' was widened from {short_type(then[col])} "
                                           f"to {short_type(now[col])} at version {c.version}"))
                    break
        then = now
    return tuple(out)


def _widened(old: str, new: str) -> bool:
    """`widens` for types as `column_types` gives them, nested ones too (a struct field, an array's elements
    or a map's values widened, nothing else changed)."""
    if not (old.startswith("{") and new.startswith("{")):
        return widens(old, new)

    def walk(a, b) -> bool | None:  # None: the same; True: only widened; False: another change
        if isinstance(a, str) and isinstance(b, str):
            return None if a == b else (True if widens(a, b) else False)
        if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
            found = [walk(a[k], b[k]) for k in a]
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            found = [walk(x, y) for x, y in zip(a, b)]
        else:
            return False
        return False if False in found else (True if True in found else None)

    return walk(json.loads(old), json.loads(new)) is True


_INTEGERS = ("byte", "short", "integer", "long")
_DECIMAL_DIGITS = {"byte": 3, "short": 5, "integer": 10, "long": 20}  # an integer type's digits as a decimal


def _decimal(text: str) -> tuple[int, int] | None:
    text = text.replace(" ", "").lower()
    if not (text.startswith("decimal(") and text.endswith(")")):
        return None
    precision, _, scale = text[len("decimal("):-1].partition(",")
    try:
        return int(precision), int(scale or 0)
    except ValueError:
        return None


def widens(old: str, new: str) -> bool:
    """Whether Delta's type widening allows a column of Delta type `old` to become `new` (primitive types
    as `column_types` gives them): an integer to a wider integer, to a double, or to a decimal with at
    least its digits before the point; float to double; a decimal to one with no fewer digits before and
    after the point; date to timestamp_ntz. Every such change keeps each value exactly."""
    old, new = old.strip().lower(), new.strip().lower()
    if old == new:
        return False
    if old in _INTEGERS:
        if new in _INTEGERS:
            return _INTEGERS.index(new) > _INTEGERS.index(old)
        if new == "double":
            return old != "long"
        wide = _decimal(new)
        return wide is not None and wide[0] - wide[1] >= _DECIMAL_DIGITS[old]
    if old == "float":
        return new == "double"
    if old == "date":
        return new == "timestamp_ntz"
    narrow, wide = _decimal(old), _decimal(new)
    if narrow is not None and wide is not None:
        return wide[1] >= narrow[1] and wide[0] - wide[1] >= narrow[0] - narrow[1]
    return False


def delta_type_name(t: pa.DataType) -> str | None:
    """The Delta name of a primitive Arrow type as `column_types` gives it (int32 -> "integer", a naive
    timestamp -> "timestamp_ntz", decimal128(10, 2) -> "decimal(10,2)"), None for another type."""
    names = {pa.int8(): "byte", pa.int16(): "short", pa.int32(): "integer", pa.int64(): "long",
             pa.float32(): "float", pa.float64(): "double", pa.date32(): "date"}
    if t in names:
        return names[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t) and t.tz is None:
        return "timestamp_ntz"
    return None


def widens_only(current: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether a table of schema `current` holds rows of `wanted` once some of its columns are widened
    (`widens`) and new ones added: every column of `current` is in `wanted`, with its type or a wider one,
    and at least one is wider."""
    wider = False
    for f in current:
        if f.name not in wanted.names:
            return False
        new = wanted.field(f.name).type
        if new == f.type:
            continue
        old_name, new_name = delta_type_name(f.type), delta_type_name(new)
        if old_name is None or new_name is None or not widens(old_name, new_name):
            return False
        wider = True
    return wider


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
