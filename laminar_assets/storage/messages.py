"""The words a store's trouble is told in, shared by the stores (`s3`, `azure`, `gcs`) and by `failures`.

Below the stores: it imports none of them nor the registry, so a store can use it and `failures` (which
asks the registry where an object's store is) can sit above them all. `plain` makes a client's text one
line; `unanswered` is the one-line `StoreUnavailableError` for a store that did not answer or refused the
connection, once the object and the store's endpoint are known.
"""

from __future__ import annotations

import re

from laminar_assets.errors import StoreUnavailableError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """`text` without terminal colour codes, on one line."""
    return " ".join(_ANSI.sub("", text).split())


def unanswered(kind: str, uri: str | None, where: str, *, then: str = "", bounds: str | None = None,
               **facts) -> StoreUnavailableError:
    """The one line for a store at `where` that did not answer (`kind` 'timeout') or refused the connection
    ('unreachable') about `uri`: the object, the endpoint, what happened, what to do, and `then` (what the
    caller left behind, e.g. that no watermark moved)."""
    what = uri or "a request"
    if kind == "timeout":
        within = f" within its time bounds ({bounds})" if bounds else " within its time bounds"
        happened = (f"{what}: the object store at {where} did not answer{within}: check that it runs and is "
                    "reachable (or raise ObjectStoreOptions.call_timeout_s / the resource's s3_call_timeout_s)")
    else:
        happened = (f"{what}: cannot connect to the object store at {where}: check that it runs and that the "
                    f"endpoint ({_endpoint_variable(uri)}, or the resource's endpoint) is right")
    return StoreUnavailableError(f"{happened}{'; ' + then if then else ''}", uri=uri, **facts)


def _endpoint_variable(uri: str | None) -> str:
    """The environment variable that sets the endpoint of `uri`'s store."""
    return "AZURE_STORAGE_ENDPOINT" if (uri or "").startswith(("abfs", "az://", "wasb")) else "AWS_ENDPOINT_URL"
