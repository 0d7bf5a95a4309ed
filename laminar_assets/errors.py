"""The one error hierarchy of Laminar.

Every error carries the facts a data engineer needs to act: what was expected,
what was found, where (flow, table, column, version, field) and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class LaminarError(Exception):
    """Base class of every error Laminar raises on purpose."""

    # Whether running the same thing again may succeed (a conflict, a lost connection). Runs are
    # idempotent, so orchestrators may retry these; every other Laminar error needs a fix first.
    retryable: bool = False

    def __init__(self, message: str, **facts: Any) -> None:
        self.message = message
        self.facts = {k: v for k, v in facts.items() if v is not None}
        super().__init__(self._render())

    def _render(self) -> str:
        if not self.facts:
            return self.message
        where = ", ".join(f"{k}={v}" for k, v in self.facts.items())
        return f"{self.message} [{where}]"


class SpecError(LaminarError):
    """A flow or stage spec is invalid; names the flow and the field."""

    def __init__(self, message: str, *, flow: str, field: str, **facts: Any) -> None:
        super().__init__(message, flow=flow, field=field, **facts)
        self.flow = flow
        self.field = field


class SqlDefinitionError(SpecError):
    """A view in a `.sql` flow file cannot be compiled; names the file, the line and the construct."""

    def __init__(self, message: str, *, file: str, line: int | None, construct: str | None = None,
                 flow: str = "?", field: str = "sql") -> None:
        super().__init__(message, flow=flow, field=field, file=file, line=line, construct=construct)


class EnvironmentProblem(LaminarError):
    """The machine lacks something Laminar needs (Java, a writable directory)."""


class LakeNotFoundError(EnvironmentProblem):
    """The storage root (`--root`) does not exist: a wrong path, or no lake has been created there yet."""


class SourceError(LaminarError):
    """A source table cannot be read as the flow needs it."""


class SourceNotFoundError(SourceError):
    """The source table does not exist at the configured location."""


class SchemaMismatchError(SourceError):
    """A source column a flow uses is missing or has an incompatible type."""


class UnsupportedTableFeatureError(SourceError):
    """The table uses a Delta feature a plain Parquet read would get wrong."""


class StrictRefreshError(LaminarError):
    """A flow with refresh policy `incremental_strict` would have needed a refill."""

    def __init__(self, message: str, *, reason: str, **facts: Any) -> None:
        super().__init__(message, reason=reason, **facts)
        self.reason = reason


class ConcurrentRunError(LaminarError):
    """Another run holds (or just committed) the same flow partition."""

    retryable = True


class CommitConflictError(LaminarError):
    """A Delta commit kept conflicting with concurrent writers after retries."""

    retryable = True


class CheckpointError(LaminarError):
    """A watermark record is unreadable or inconsistent with the tables."""


class RunFailedError(LaminarError):
    """Spark failed while executing a run; the watermark did not move."""

    # How a lost Spark Connect session or driver connection surfaces (by name, so that this module
    # imports neither pyspark, grpc nor py4j). SQL errors over Connect subclass SparkConnectGrpcException,
    # so only that exact class with an UNAVAILABLE status counts, never its subclasses.
    _LOST_CONNECTION = {"RetriesExceeded", "_InactiveRpcError", "_MultiThreadedRendezvous", "Py4JNetworkError"}
    # A Spark Connect server that restarted while the client retried answers with a new session id; the client
    # then closes its session and raises `[NO_ACTIVE_SESSION]` (from None: the gRPC error is only its context).
    # A new session works (SparkResource.get_session starts one when the run's was closed).
    _LOST_SESSION = ("[NO_ACTIVE_SESSION]", "[INVALID_HANDLE.SESSION_CHANGED]", "[INVALID_HANDLE.SESSION_NOT_FOUND]",
                     "[INVALID_HANDLE.SESSION_CLOSED]")

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        seen: set[int] = set()
        cause = self.__cause__
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            name = type(cause).__name__
            if isinstance(cause, ConnectionError) or name in self._LOST_CONNECTION or (
                    name == "SparkConnectGrpcException" and "UNAVAILABLE" in str(cause)) or (
                    name in ("SparkConnectException", "PySparkRuntimeError")
                    and str(cause).lstrip().startswith(self._LOST_SESSION)):
                return True
            cause = cause.__cause__ or cause.__context__
        return False


class InjectedCrash(LaminarError):
    """Raised by the crash-injection hook in tests (simulates a kill)."""


class StorageError(EnvironmentProblem):
    """The lake's storage cannot be used as asked: an unreachable object store, refused
    credentials, a missing bucket, a scheme Laminar does not support."""


class StoreUnavailableError(StorageError):
    """The object store did not answer within its time bounds, or nobody accepted the connection: a
    store that is down, frozen or cut off. Names the endpoint and the object; a later run may succeed
    (the run's watermarks did not move, so it picks the work up again)."""

    retryable = True


class ContractError(LaminarError):
    """A data contract file is malformed or disagrees with its table."""


class ExportError(LaminarError):
    """An export could not deliver its source's changes to its target; nothing of the delivery is
    visible there (for a transactional target) and its delivered version did not move."""

    def __init__(self, message: str, *, export: str, **facts: Any) -> None:
        super().__init__(message, export=export, **facts)
        self.export = export


class ExportTargetError(ExportError):
    """The target of an export cannot be used: unreachable, refused credentials, a missing permission.
    Never carries a password or a connection URL (only host, port, database and user)."""

    def __init__(self, message: str, *, export: str, retryable: bool = False, **facts: Any) -> None:
        super().__init__(message, export=export, **facts)
        self._retryable = retryable

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self._retryable  # a server that is down may be back; a wrong password will not be


class ExportSchemaError(ExportError):
    """A target table whose columns or key do not match the export's source; refused before writing."""


class ConcurrentDeliveryError(ExportError):
    """Another delivery of the same export moved its delivered version first; this one rolled back."""

    retryable = True


class CatalogError(EnvironmentProblem):
    """The catalog Laminar registers its tables in cannot be used as asked: a session without a metastore, a
    metastore another process holds (embedded Derby), a metastore database that refuses (a wrong password, an
    unreachable server), an entry of the schema that is not Laminar's."""


class CatalogNameError(SourceNotFoundError):
    """A source named by its catalog name (`raw.trades`) that the catalog does not know; nothing was written."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """"did you mean 'x'? " for the known names closest to a misspelled `name` (at most two), to put in front of
    the list of every known name; "" when none is close."""
    by_lower = {str(k).lower(): str(k) for k in sorted(map(str, known))}  # OHLC_5M is ohlc_5m
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(by_lower[c]) for c in close)}? " if close else ""

