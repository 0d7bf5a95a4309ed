"""A store that stopped answering, as one line: recognized in what any client said about it.

Laminar reaches a bucket through four clients, and each reports a store that does not answer in its
own words: boto3 (`ReadTimeoutError`, handled where Laminar calls it, `s3.S3Store._call`), deltalake
(an `OSError` "Generic S3 error" whose message lists the causes on several lines with ANSI colour
codes), pyarrow ("AWS Error NETWORK_CONNECTION ... curlCode: 28") and Spark's s3a (Java exceptions
such as `SocketTimeoutException` or `AWSApiCallTimeoutException` about an s3a:// path, behind a
Py4J or Spark error). `recognize` reads those texts (the caller collects them: this package imports
no Spark) and finds the object and the endpoint; `unavailable` makes the one-line
`StoreUnavailableError` the engine raises instead (its words: `messages.unanswered`, which the stores use
too). Nothing here ever prints an option's secret: the endpoint comes from a URL in the message or from the
store's `describe()` (the registry's store for the object: this module sits above the stores).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from laminar_assets.errors import StoreUnavailableError

from .azure import canonical
from .messages import plain, unanswered
from .registry import mounts, store_for

# What each client says when a store does not answer (a timeout) ...
# (specific phrases only: Spark's own "Futures timed out" about a plan over s3a:// paths is no store's)
_TIMEOUT = ("operation timed out", "Read timed out", "connect timed out", "Timeout was reached", "curlCode: 28",
            "SocketTimeoutException", "ApiCallTimeoutException", "ApiCallAttemptTimeoutException",
            "AWSApiCallTimeoutException", "Read timeout on endpoint", "ConnectTimeoutException",
            "Connect timeout on endpoint")
# ... and when nobody accepts the connection
_REFUSED = ("Connection refused", "tcp connect error", "curlCode: 7", "Couldn't connect to server",
            "ConnectException", "NoHttpResponseException", "Could not connect to the endpoint URL",
            "Connection reset by peer", "connection closed before message completed", "dns error")
# A message must also be about an object store (not, say, a Spark Connect channel)
_STORE: tuple[str, ...] = ("S3 error", "AWS Error", "s3a://", "s3://", "AWSClientIOException", "SdkClientException",
          "amazonaws", "Error performing")
_STORE += ("GCS error", "gs://", "com.google.cloud.hadoop", "google::cloud")  # GCS (gcs.py)

# Azure's clients: deltalake ("Generic MicrosoftAzure error" with the blob's URL), Spark's ABFS (abfs[s]:// paths)
_AZURE = ("MicrosoftAzure", "abfs://", "abfss://", ".core.windows.net", "AbfsRestOperation", "AzureBlobFileSystem")
_STORE += _AZURE
_AZURE_URI = re.compile(r"abfss?://[^\s\"'<>,;)]+")
_HTTP_URL = re.compile(r"https?://[^\s\"'<>,;)]+")
_S3_URI = re.compile(r"s3a?://[^\s\"'<>,;)]+")
_GS_URI = re.compile(r"gs://[^\s\"'<>,;)]+")
_ARROW_KEY = re.compile(r"key '(?P<key>[^']*)' in bucket '(?P<bucket>[^']+)'")


@dataclass(frozen=True)
class StoreFailure:
    """A store that did not answer (`kind` 'timeout') or refused the connection ('unreachable')."""

    kind: str
    uri: str | None  # the object (s3://bucket/key), when a client named it
    endpoint: str | None  # http(s)://host:port, when a client named it
    client: str = "python"  # "s3a" when Spark's connector met it (its timeouts have Hadoop's floor)

    def where(self) -> str:
        """The endpoint a client named, else the one the object's store is configured with."""
        if self.endpoint:
            return self.endpoint
        if self.uri:
            try:
                return store_for(self.uri).describe()
            except Exception:  # noqa: BLE001  (a message must not fail for want of an endpoint)
                pass
        if self.client == "abfs":  # ABFS names no path nor host: the Azure store mounted, when just one is
            found = {s.describe() for s in mounts().values() if type(s).__name__ == "AzureStore"}
            if len(found) == 1:
                return found.pop()
        return "the object store"


def recognize(texts: Iterable[str]) -> StoreFailure | None:
    """The store failure the texts (messages of an error and its causes) describe, or None."""
    texts = [plain(t) for t in texts if t]
    found = [t for t in texts if any(s in t for s in _STORE) and any(m in t for m in _TIMEOUT + _REFUSED)]
    if not found:
        return None
    text = " ".join(found)
    kind = "timeout" if any(m in text for m in _TIMEOUT) else "unreachable"
    uri, endpoint = None, None
    every = " ".join(texts)
    for match in _HTTP_URL.finditer(every):
        parts = urlsplit(match.group(0).rstrip(".:"))
        if not parts.hostname:
            continue
        endpoint = endpoint or f"{parts.scheme}://{parts.netloc}"
        path = unquote(parts.path.lstrip("/"))
        if uri is None and "/" in path and not parts.hostname.endswith("amazonaws.com"):
            uri = f"s3://{path}"  # path-style addressing: /bucket/key
    s3 = _S3_URI.search(every)
    if s3 is not None:
        uri = "s3://" + s3.group(0).split("://", 1)[1].rstrip(".:")
    gs = _GS_URI.search(every)
    if gs is not None:
        uri = gs.group(0).rstrip(".:")
    elif uri is not None and "GCS error" in text:
        uri = "gs://" + uri.split("://", 1)[1]  # deltalake on GCS: the XML API's /bucket/key
    arrow = _ARROW_KEY.search(every)
    if arrow is not None and uri is None:
        uri = f"s3://{arrow['bucket']}/{arrow['key']}".rstrip("/")
    if any(a in every for a in _AZURE):
        uri = _azure_uri(every) or uri
    if endpoint and endpoint.endswith("amazonaws.com"):
        endpoint = None  # a region's host: the store's own description says it better
    client = "s3a" if any("s3a://" in t or "org.apache.hadoop.fs.s3a" in t for t in found) else "python"
    if client == "python" and any("org.apache.hadoop.fs.azurebfs" in t for t in found):
        client = "abfs"
    return StoreFailure(kind, uri, endpoint, client)


def _azure_uri(text: str) -> str | None:
    """The Azure object a client's text names: an abfs[s]:// path (Spark), else a blob URL (deltalake:
    `https://<account>.blob.core.windows.net/<container>/<blob>`, or an emulator's `<endpoint>/<account>/...`)."""
    found = _AZURE_URI.search(text)
    if found is not None:
        return canonical(found.group(0).rstrip(".:"))
    for match in _HTTP_URL.finditer(text):
        parts = urlsplit(match.group(0).rstrip(".:"))
        segments = [s for s in unquote(parts.path).split("/") if s]
        host = parts.hostname or ""
        if ".blob." in host or ".dfs." in host:
            account, segments = host.split(".", 1)[0], segments
        elif len(segments) >= 2:
            account, segments = segments[0], segments[1:]
        else:
            continue
        if segments:
            return canonical(f"abfss://{segments[0]}@{account}.dfs.core.windows.net/" + "/".join(segments[1:]))
    return None


def unavailable(failure: StoreFailure, *, then: str = "", bounds: str | None = None,
                **facts) -> StoreUnavailableError:
    """The one line for `failure`: the object, the endpoint, what happened, what to do, and `then`
    (what the caller left behind, e.g. that no watermark moved)."""
    return unanswered(failure.kind, failure.uri, failure.where(), then=then, bounds=bounds, **facts)
