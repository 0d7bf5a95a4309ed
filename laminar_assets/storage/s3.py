"""`S3Store`: a lake in S3 or an S3-compatible store (s3://bucket/key; s3a:// is the same).

Put-if-absent by `If-None-Match: *`, compare-and-swap by `If-Match: <ETag>` (an object store has no
atomic rename); the store checks the condition and writes in one request. Every request goes through
`_call`, which turns the SDK's failures into what a caller can act on: a missing object, a failed
precondition, or a one-line `StorageError` naming the URI, the store and the fix.

The store's options (`ObjectStoreOptions`) are its own: two stores with different endpoints or
credentials live side by side. Unset fields come from the AWS environment when a client is made
(never at import), and a client is remade when what they resolve to changes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

from laminar_assets.errors import StorageError, StoreUnavailableError

from .messages import plain, unanswered
from .options import ObjectStoreOptions

_HADOOP = "spark.hadoop.fs.s3a."


def split(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// or s3a:// URI."""
    parts = urlsplit(uri.rstrip("/"))
    return parts.netloc, parts.path.lstrip("/")


def _body_and_tag(got) -> tuple[bytes, str]:
    return got["Body"].read(), got["ETag"]


class _Missing(Exception):
    pass


class _PreconditionFailed(Exception):
    pass


class S3Store:
    """S3 and S3-compatible stores, reached with `options` (default: the AWS environment)."""

    schemes: ClassVar[tuple[str, ...]] = ("s3", "s3a")
    spark_scheme: ClassVar[str | None] = "s3a"
    jars: ClassVar[str | None] = "s3"
    object_store: ClassVar[bool] = True

    def __init__(self, options: ObjectStoreOptions | None = None) -> None:
        self.options = options or ObjectStoreOptions()
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[ObjectStoreOptions, Any]] = {}  # kind -> (resolved options, client)
        # until when (time.monotonic()) calls fail at once: the store was just found not answering
        self._silent_until = 0.0

    def __eq__(self, other: object) -> bool:
        return type(other) is S3Store and other.options == self.options

    def __hash__(self) -> int:
        return hash((S3Store, self.options))

    def __repr__(self) -> str:
        return f"S3Store({self.options!r})"

    def describe(self) -> str:
        return self.options.describe()

    # --- clients ---------------------------------------------------------------------------------
    def _made(self, kind: str, make):
        """The client of `kind` for what the options resolve to now (made again when that changed)."""
        resolved = self.options.resolved()
        with self._lock:
            found = self._clients.get(kind)
            if found is None or found[0] != resolved:
                found = self._clients[kind] = (resolved, make(resolved))
            return found[1]

    def client(self):
        """The boto3 client of this store (conditional writes: If-None-Match, If-Match)."""
        return self._made("boto3", ObjectStoreOptions.client)

    def arrow_filesystem(self):
        return self._made("arrow", ObjectStoreOptions.arrow_filesystem)

    # --- reading ---------------------------------------------------------------------------------
    def read_tagged(self, uri: str) -> tuple[bytes, str] | None:
        bucket, key = split(uri)
        try:
            # the body is read within the call: a store that stops answering mid-body is bounded too
            return self._call(uri, lambda c: _body_and_tag(c.get_object(Bucket=bucket, Key=key)), missing_ok=True)
        except _Missing:
            return None

    def exists(self, uri: str) -> bool:
        bucket, key = split(uri)
        try:
            self._call(uri, lambda c: c.head_object(Bucket=bucket, Key=key), missing_ok=True)
        except _Missing:
            return False
        return True

    def list_files(self, uri: str) -> list[tuple[str, int]]:
        bucket, key = split(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out = []
        pages = self._call(uri, lambda c: list(c.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                                            Prefix=prefix)))
        for page in pages:
            out += [(f"s3://{bucket}/{o['Key']}", int(o["Size"])) for o in page.get("Contents", [])]
        return sorted(out)

    def list_tagged(self, uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
        """One listing request per 1000 names, starting at `after` (StartAfter): what a folder holds
        before it costs nothing."""
        bucket, key = split(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out: list[tuple[str, str]] = []
        token = None
        while True:
            kw = {"ContinuationToken": token} if token else ({"StartAfter": prefix + after} if after else {})
            page = self._call(uri, lambda c, kw=kw: c.list_objects_v2(Bucket=bucket, Prefix=prefix, **kw))
            for o in page.get("Contents", []):
                name = o["Key"][len(prefix):]
                if until is not None and name > until:
                    return out
                out.append((name, o["ETag"]))
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")

    def some_files(self, uri: str, limit: int) -> list[str]:
        bucket, key = split(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        page = self._call(uri, lambda c: c.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=limit))
        return [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]

    def list_dirs(self, uri: str) -> list[str]:
        bucket, key = split(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        names: set[str] = set()
        pages = self._call(uri, lambda c: list(c.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/")))
        for page in pages:
            names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)

    # --- writing ---------------------------------------------------------------------------------
    def write(self, uri: str, data: bytes) -> str:
        bucket, key = split(uri)
        return self._call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data))["ETag"]

    def create_tagged(self, uri: str, data: bytes) -> str | None:
        """The PUT's answer carries the ETag: the tag without reading the object back."""
        bucket, key = split(uri)
        try:
            put = self._call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"),
                             precondition=True)
        except _PreconditionFailed:
            return None
        return put["ETag"]

    def replace_tagged(self, uri: str, data: bytes, tag: str) -> str | None:
        bucket, key = split(uri)
        try:
            put = self._call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data, IfMatch=tag),
                             precondition=True)
        except (_PreconditionFailed, _Missing):
            return None
        return put["ETag"]

    def delete(self, uri: str, *, tag: str | None = None) -> bool:
        """Without a tag, S3 answers alike whether the object was there or not (True)."""
        bucket, key = split(uri)
        kw = {"IfMatch": tag} if tag is not None else {}
        try:
            self._call(uri, lambda c: c.delete_object(Bucket=bucket, Key=key, **kw), precondition=True,
                       missing_ok=True)
        except (_PreconditionFailed, _Missing):
            return False
        return True

    def copy(self, source: str, target: str) -> None:
        """Server-side, within the store."""
        (bucket, key), (to_bucket, to_key) = split(source), split(target)
        self._call(target, lambda c: c.copy_object(CopySource={"Bucket": bucket, "Key": key}, Bucket=to_bucket,
                                                    Key=to_key))

    def delete_tree(self, uri: str) -> None:
        """One listing, then batches of up to 1000 keys per request."""
        bucket, _ = split(uri)
        keys = [u[len(f"s3://{bucket}/"):] for u, _ in self.list_files(uri)]
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i:i + 1000]]
            self._call(uri, lambda c, batch=batch: c.delete_objects(Bucket=bucket,
                                                                    Delete={"Objects": batch, "Quiet": True}))

    def check_reachable(self, uri: str) -> None:
        bucket, _ = split(uri)
        self._call(uri, lambda c: c.head_bucket(Bucket=bucket), bucket_request=True)

    def not_answering(self) -> None:
        self._silent_until = time.monotonic() + self.options.call_timeout_s

    # --- what the other clients are given --------------------------------------------------------
    def delta_options(self, uri: str) -> dict[str, str] | None:
        return self.options.delta_options()

    def filesystem(self, uri: str):
        bucket, key = split(uri)
        return self.arrow_filesystem(), f"{bucket}/{key}".rstrip("/")

    def spark_conf(self, uri: str | None = None) -> dict[str, str]:
        """s3a's settings; with a URI, as s3a's per-bucket settings (`fs.s3a.bucket.<bucket>.*`, which
        override the scheme's own for that bucket), so buckets on different endpoints or with different
        credentials coexist in one Spark session. A bucket on AWS (no endpoint) gets the region's
        endpoint, so it does not inherit another store's endpoint from the scheme-wide settings."""
        conf = self.options.spark_conf()
        bucket = split(uri)[0] if uri else ""
        if not bucket:
            return conf
        if f"{_HADOOP}endpoint" not in conf:
            conf[f"{_HADOOP}endpoint"] = f"s3.{self.options.resolved().region}.amazonaws.com"
        per_bucket = f"{_HADOOP}bucket.{bucket}."
        return {per_bucket + k[len(_HADOOP):]: v for k, v in conf.items()}

    def env(self) -> dict[str, str]:
        return self.options.as_env()

    # --- plumbing ----------------------------------------------------------------------------------
    def _call(self, uri: str, request, *, precondition: bool = False, missing_ok: bool = False,
              bucket_request: bool = False):
        """One S3 request, with its failures turned into what a caller can act on: a missing object
        (`_Missing`), a failed precondition (`_PreconditionFailed`) or a `StorageError` naming the URI
        and the fix (unreachable endpoint, refused credentials, missing bucket)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        where = self.describe()
        if time.monotonic() < self._silent_until:
            raise StoreUnavailableError(
                f"{uri}: the object store at {where} did not answer a moment ago and is not waited on again "
                f"for {self.options.call_timeout_s:g} s: check that it runs and is reachable", uri=uri)
        try:
            out = request(self.client())
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, status = str(error.get("Code", "")), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if precondition and (status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")):
                raise _PreconditionFailed() from None
            if code == "NoSuchBucket" or (bucket_request and (status == 404 or code in ("404", "NotFound"))):
                raise StorageError(f"{uri}: bucket {split(uri)[0]!r} does not exist on {where}: create it, or fix "
                                   "the lake's URI", uri=uri) from None
            if missing_ok and (status == 404 or code in ("NoSuchKey", "404", "NotFound")):
                raise _Missing() from None
            if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                raise StorageError(f"{uri}: {where} refused the credentials ({code or status}): set AWS_ACCESS_KEY_ID "
                                   "and AWS_SECRET_ACCESS_KEY (or a profile, or the resource's credentials) to a key "
                                   "that may read and write this bucket", uri=uri) from None
            raise StorageError(f"{uri}: {where} answered {code or status}: {error.get('Message', '')}".rstrip(": "),
                               uri=uri) from None
        except NoCredentialsError:
            raise StorageError(f"{uri}: no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                               "AWS_PROFILE, or the resource's credentials", uri=uri) from None
        except (ReadTimeoutError, ConnectTimeoutError):  # (ConnectTimeoutError is an EndpointConnectionError)
            self.not_answering()
            raise unanswered("timeout", uri, where, bounds=self.options.resolved().budget()) from None
        except EndpointConnectionError:  # refused at once: nothing to wait out
            raise StoreUnavailableError(
                f"{uri}: cannot connect to {where}: check that the store runs and that the endpoint "
                "(AWS_ENDPOINT_URL, or the resource's endpoint) is right", uri=uri) from None
        except BotoCoreError as exc:
            raise StorageError(f"{uri}: {where}: {plain(str(exc))}", uri=uri) from None
        self._silent_until = 0.0
        return out
