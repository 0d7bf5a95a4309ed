"""What a failed Spark job says, in one line: the Java cause behind a Py4J error ("An error occurred
while calling o516.getResult." says nothing), and whether a read failed because a file stores a
column under another type than the schema it was read with."""

from __future__ import annotations

import re

from py4j.protocol import Py4JError, Py4JJavaError

from laminar_assets.storage.failures import plain

# A Parquet file's column type differs from the read schema's (Spark 4: FAILED_READ_FILE.<this>;
# Spark 3: the exception class, "Parquet column cannot be converted in file ...")
_MISMATCH = ("PARQUET_COLUMN_DATA_TYPE_MISMATCH", "SchemaColumnConvertNotSupportedException",
             "Parquet column cannot be converted")
_DETAIL = re.compile(r"reading file (?P<file>\S+?)\.? Data type mismatches when reading Parquet column "
                     r"\[?(?P<column>[^\]\s]+)\]?\. Expected Spark type (?P<want>\S+?),? actual Parquet type "
                     r"(?P<have>\w+)")
_MAX_CHAIN = 20


def _java_chain(exc: BaseException) -> list[str]:
    """'<class>: <message>' of the Java exception behind a Py4J error and of each of its causes."""
    java = getattr(exc, "java_exception", None) if isinstance(exc, Py4JJavaError) else None
    out: list[str] = []
    try:
        while java is not None and len(out) < _MAX_CHAIN:
            out.append(f"{java.getClass().getName()}: {java.getMessage() or ''}")
            java = java.getCause()
    except Py4JError:  # the JVM is gone: what was read so far
        pass
    return out


def _texts(exc: BaseException | None) -> list[str]:
    """Every message of `exc`, its Python causes, their Spark conditions and their Java causes."""
    out: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(exc))
        condition = getattr(exc, "getCondition", None)
        try:
            if callable(condition) and condition():
                out.append(str(condition()))
        except Exception:  # noqa: BLE001  (a condition that cannot be read adds nothing)
            pass
        out.append(str(exc))
        out.extend(_java_chain(exc))
        exc = exc.__cause__ or exc.__context__
    return out


def texts(exc: BaseException) -> list[str]:
    """Every message of `exc`, its Python causes, their Spark conditions and their Java causes (for
    `laminar_assets.storage.failures.recognize`)."""
    return _texts(exc)


def type_mismatch(exc: BaseException) -> str | None:
    """When a read failed because a file stores a column under another type than the read schema:
    one line naming the file, the column and both types; else None."""
    texts = _texts(exc)
    if not any(m in t for t in texts for m in _MISMATCH):
        return None
    for t in texts:
        found = _DETAIL.search(" ".join(t.split()))
        if found:
            return (f"file {found['file']} stores column {found['column']} as {found['have']}, read as "
                    f"{found['want']}")
    line = next(t for t in texts if any(m in t for m in _MISMATCH))
    return " ".join(line.split())[:300]


def first_line(exc: BaseException) -> str:
    """The first line of what failed: for a Py4J error, its Java cause's message (the Spark error
    condition when there is one) instead of the Py4J call that carried it; followed by the SQL
    fragment Spark names as where it failed (`px > 0` of a rule whose cast failed), which Spark
    prints on the lines after the first."""
    line = plain(_first_line(exc))  # deltalake colours its causes (ANSI codes): never in a message
    fragment = query_fragment(exc)
    return f"{line} (in `{fragment}`)" if fragment and fragment not in line else line


def _first_line(exc: BaseException) -> str:
    chain = _java_chain(exc)
    if chain:
        messages = [m.split(": ", 1)[1].strip() for m in chain if ": " in m]
        useful = [m for m in messages if m and not m.startswith("Exception thrown in awaitResult")]
        text = next((m for m in useful if m.startswith("[")), useful[0] if useful else "")
        if text:
            return text.splitlines()[0][:400]
    text = str(exc).strip().split("\n")[0]
    return text[:400] or type(exc).__name__


def query_fragment(exc: BaseException | None) -> str | None:
    """The SQL text Spark says an error happened in (its query context), on one line; None when it
    names none. Asked of the Python exception (classic or Spark Connect) and of its Java causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(exc))
        contexts = _contexts(exc)
        java = getattr(exc, "java_exception", None) if isinstance(exc, Py4JJavaError) else None
        while not contexts and java is not None and len(seen) < _MAX_CHAIN:
            seen.add(id(java))
            try:
                contexts = list(java.getQueryContext() or [])  # a SparkThrowable's
            except Py4JError:  # not a SparkThrowable
                pass
            try:
                java = java.getCause()
            except Py4JError:  # the JVM is gone
                break
        for ctx in contexts:
            try:
                text = " ".join(str(ctx.fragment() or "").split())
            except (Py4JError, AttributeError):
                continue
            if text:
                return text[:200]
        exc = exc.__cause__ or exc.__context__
    return None


def _contexts(exc: BaseException) -> list:
    getter = getattr(exc, "getQueryContext", None)
    try:
        return list(getter() or []) if callable(getter) else []
    except Exception:  # noqa: BLE001  (contexts that cannot be read add nothing)
        return []

