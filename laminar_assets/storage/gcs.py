"""`GcsStore`: a lake in Google Cloud Storage (gs://bucket/key), or in a GCS emulator.

Conditional writes are GCS's generation preconditions, checked by the store with the write in one
request: a tag is the object's generation (a number GCS gives each version of an object), and

    create_tagged    ifGenerationMatch=0            (only if no live version exists)
    replace_tagged   ifGenerationMatch=<tag>        (only if still that version)
    delete(tag=)     ifGenerationMatch=<tag>

The requests go through google-cloud-storage (Google's own client of GCS's JSON API), which reaches an
emulator through its `api_endpoint` client option; every call gets the store's time bounds (a
connect and a read timeout per attempt, a retry with at most `max_attempts` attempts that starts no
attempt after `call_timeout_s - request_timeout_s`), and `_call` turns its failures into what a caller
acts on: a missing object, a failed precondition, or a one-line `StorageError` naming the URI, the store
and the fix.

The other clients get the same store: deltalake (object_store's `google_*` options; an emulator through
a key whose `gcs_base_url` names it, with OAuth off), pyarrow's `GcsFileSystem` (`endpoint_override`,
`scheme`, `anonymous`, or an access token from the key file) and Spark's GCS connector for Hadoop 3
(`fs.gs.*`). The GCS connector has no per-bucket settings (s3a's `fs.s3a.bucket.<b>.*` has no
counterpart): its settings are scheme-wide, so one Spark session reaches gs:// buckets with one set of
options (docs/known-limits.md).

Credentials: `GcsOptions.credentials` (a JSON key file: a service account's, an authorized user's or a
workload identity federation's), else `GOOGLE_APPLICATION_CREDENTIALS`, else Google's default chain
(gcloud's application-default login, the metadata server on Google Cloud). An endpoint without
credentials (an emulator) is reached anonymously. Nothing here logs or prints a key; the key file's
path is named in messages, never its content.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

from laminar_assets.errors import StorageError, StoreUnavailableError

from .messages import plain
from .options import ObjectStoreOptions, TimeBounds, _ms

_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_HADOOP = "spark.hadoop.fs.gs."
_CONNECTOR = "com.google.cloud.hadoop.fs.gcs"

MIB = 1 << 20
_SIZES = {"block.size": 64 * MIB, "rewrite.max.chunk.size": 512 * MIB, "outputstream.buffer.size": 8 * MIB,
          "inputstream.inplace.seek.limit": 8 * MIB, "inputstream.min.range.request.size": 2 * MIB}

_ENV = {  # field -> environment variables, first set wins (read when a client is made, never at import)
    "endpoint": ("STORAGE_EMULATOR_HOST",),  # the Google libraries' own emulator variable
    "project": ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"),
    "credentials": ("GOOGLE_APPLICATION_CREDENTIALS",),
}


@dataclass(frozen=True)
class GcsOptions(TimeBounds):
    """Where a GCS store is and how to talk to it (keyword options; all optional)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:4443 for an emulator; None: Google Cloud Storage
    project: str | None = None
    credentials: str | None = None  # the path of a JSON key file (never its content)
    # No credentials at all (an emulator, a public bucket). None: on exactly when an endpoint is set and
    # no key file is.
    anonymous: bool | None = None
    # and the time bounds of `TimeBounds`, as `ObjectStoreOptions`'s

    @classmethod
    def of(cls, options: GcsOptions | ObjectStoreOptions | None) -> GcsOptions:
        """`options` as GCS options: an `ObjectStoreOptions` (what a resource or an engine is given without
        knowing the scheme) gives its time bounds only, and may not name an S3 endpoint or key."""
        if options is None:
            return cls()
        if isinstance(options, GcsOptions):
            return options
        if isinstance(options, ObjectStoreOptions):
            s3_only = [f for f in ("endpoint", "access_key_id", "secret_access_key", "session_token", "profile")
                       if getattr(options, f) is not None]
            if s3_only:
                raise StorageError(f"a gs:// root was given S3 options ({', '.join(s3_only)}): give it GcsOptions "
                                   "(endpoint, credentials, project) or the resource's gcs_* fields")
            return cls(**options.bounds())
        raise StorageError(f"a gs:// store takes GcsOptions, not {type(options).__name__}")

    def resolved(self) -> GcsOptions:
        """These options with unset fields taken from the environment (read now, not at import)."""
        out = self._from_env(_ENV)
        if out.endpoint and "://" not in out.endpoint:
            out = replace(out, endpoint=f"http://{out.endpoint}")  # STORAGE_EMULATOR_HOST=host:port
        if out.endpoint:
            out = replace(out, endpoint=out.endpoint.rstrip("/"))
        if out.anonymous is None:
            out = replace(out, anonymous=bool(out.endpoint) and not out.credentials)
        return out

    def describe(self) -> str:
        """Where the store is, for messages (no secrets)."""
        return self.resolved().endpoint or "Google Cloud Storage"

    def as_env(self) -> dict[str, str]:
        """The options as the Google environment variables, for a process Laminar starts."""
        o = self.resolved()
        pairs = {"STORAGE_EMULATOR_HOST": o.endpoint, "GOOGLE_CLOUD_PROJECT": o.project,
                 "GOOGLE_APPLICATION_CREDENTIALS": o.credentials}
        return {k: v for k, v in pairs.items() if v}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def split(uri: str) -> tuple[str, str]:
    """(bucket, key) of a gs:// URI."""
    parts = urlsplit(uri.rstrip("/"))
    return parts.netloc, parts.path.lstrip("/")


def _prefix(key: str) -> str:
    return key.rstrip("/") + "/" if key else ""


class _Missing(Exception):
    pass


class _PreconditionFailed(Exception):
    pass


class GcsStore:
    """Google Cloud Storage or an emulator, reached with `options` (default: the Google environment)."""

    schemes: ClassVar[tuple[str, ...]] = ("gs",)
    spark_scheme: ClassVar[str | None] = "gs"
    jars: ClassVar[str | None] = "gcs"
    object_store: ClassVar[bool] = True

    def __init__(self, options: GcsOptions | ObjectStoreOptions | None = None) -> None:
        self.options = GcsOptions.of(options)
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[Any, Any]] = {}  # kind -> (what it was made for, client)
        self._silent_until = 0.0  # until when (time.monotonic()) calls fail at once

    def __eq__(self, other: object) -> bool:
        return type(other) is GcsStore and other.options == self.options

    def __hash__(self) -> int:
        return hash((GcsStore, self.options))

    def __repr__(self) -> str:
        return f"GcsStore({self.options!r})"

    def describe(self) -> str:
        return self.options.describe()

    # --- clients ---------------------------------------------------------------------------------
    def _credentials(self, o: GcsOptions):
        """(credentials, project) for `o`: anonymous, the key file's, or Google's default chain."""
        import google.auth
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError

        if o.anonymous:
            return AnonymousCredentials(), o.project
        try:
            if o.credentials:
                credentials, project = google.auth.load_credentials_from_file(o.credentials, scopes=[_SCOPE])
            else:
                credentials, project = google.auth.default(scopes=[_SCOPE])
        except DefaultCredentialsError as exc:
            where = (f"the key file {o.credentials} (GOOGLE_APPLICATION_CREDENTIALS, or the resource's "
                     "gcs_credentials)" if o.credentials else "Google's default chain")
            reason = "is missing or not a key file" if o.credentials else f"found none ({plain(str(exc))[:120]})"
            raise StorageError(f"no usable credentials for {self.describe()}: {where} {reason}: set "
                               "GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key file (or run "
                               "`gcloud auth application-default login`)") from None
        return credentials, o.project or project

    def client(self):
        """The google-cloud-storage client of this store (generation preconditions)."""
        o = self.options.resolved()
        with self._lock:
            found = self._clients.get("client")
            if found is not None and found[0] == o:
                return found[1]
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage as gcs

        credentials, project = self._credentials(o)
        http = None
        if not isinstance(credentials, AnonymousCredentials):
            from google.auth.transport.requests import AuthorizedSession

            # a token refresh is bounded too (the library's default waits two minutes)
            http = AuthorizedSession(credentials, refresh_timeout=o.call_timeout_s)
        made = gcs.Client(project=project or "<none>", credentials=credentials, _http=http,
                          client_options={"api_endpoint": o.endpoint} if o.endpoint else None)
        with self._lock:
            self._clients["client"] = (o, made)
        return made

    def arrow_filesystem(self):
        """pyarrow's GCS filesystem on this store: an emulator by `endpoint_override`, anonymous or with an
        access token from the key file (made again before the token expires), else the default chain."""
        import pyarrow.fs as pafs

        o = self.options.resolved()
        with self._lock:
            found = self._clients.get("arrow")
            if found is not None and found[0][0] == o and (found[0][1] is None or found[0][1] > time.time() + 300):
                return found[1]
        kw: dict[str, Any] = {"retry_time_limit": timedelta(seconds=o.call_timeout_s)}
        if o.endpoint:
            scheme, _, host = o.endpoint.partition("://")
            kw.update(endpoint_override=host, scheme=scheme)
        if o.project:
            kw["project_id"] = o.project
        expires = None
        if o.anonymous:
            kw["anonymous"] = True
        elif o.credentials:
            from google.auth.transport.requests import Request

            credentials, _ = self._credentials(o)
            token_request = Request()
            bounded = lambda **kw: token_request(timeout=o.call_timeout_s, **kw)  # noqa: E731  (google-auth: 120 s)
            self._call(o.credentials, lambda _c: credentials.refresh(bounded), raw=True)
            kw.update(access_token=credentials.token, credential_token_expiration=credentials.expiry)
            expires = credentials.expiry.timestamp() if credentials.expiry else None
        made = pafs.GcsFileSystem(**kw)
        with self._lock:
            self._clients["arrow"] = ((o, expires), made)
        return made

    def _blob(self, uri: str):
        bucket, key = split(uri)
        return self.client().bucket(bucket).blob(key)

    def _kw(self) -> dict[str, Any]:
        """Each request's time bounds: (connect, read) timeouts per attempt and the call's retry."""
        o = self.options.resolved()
        return {"timeout": (o.connect_timeout_s, o.request_timeout_s), "retry": _retry(o)}

    # --- reading ---------------------------------------------------------------------------------
    def read_tagged(self, uri: str) -> tuple[bytes, str] | None:
        """One media GET: the answer's x-goog-generation header is the tag."""
        def read(_client):
            blob = self._blob(uri)
            data = blob.download_as_bytes(**self._kw())
            return data, str(blob.generation)

        try:
            return self._call(uri, read, missing_ok=True)
        except _Missing:
            return None

    def exists(self, uri: str) -> bool:
        return self._call(uri, lambda _c: self._blob(uri).exists(**self._kw()))

    def _names(self, uri: str, **kw) -> list[Any]:
        """The objects under the folder `uri` (GCS lists by prefix, in name order), without the empty
        "folder/" placeholders that some clients (the GCS connector's mkdirs) write."""
        bucket, key = split(uri)
        pages = self._call(uri, lambda c: list(c.list_blobs(bucket, prefix=_prefix(key), **kw, **self._kw())))
        return [b for b in pages if not b.name.endswith("/")]

    def list_files(self, uri: str) -> list[tuple[str, int]]:
        bucket, _ = split(uri)
        return sorted((f"gs://{bucket}/{b.name}", int(b.size or 0)) for b in self._names(uri))

    def list_tagged(self, uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
        """One listing request per 1000 names, from `after` on (GCS's startOffset, which includes the
        name itself, so it is skipped) and up to `until` (endOffset is exclusive: the name past `until`)."""
        _, key = split(uri)
        prefix = _prefix(key)
        kw: dict[str, Any] = {}
        if after:
            kw["start_offset"] = prefix + after
        if until is not None:
            kw["end_offset"] = prefix + until + "\x00"
        out = []
        for blob in self._names(uri, **kw):
            name = blob.name[len(prefix):]
            if name <= after or (until is not None and name > until):
                continue
            out.append((name, str(blob.generation)))
        return out

    def some_files(self, uri: str, limit: int) -> list[str]:
        bucket, key = split(uri)
        found = self._call(uri, lambda c: list(c.list_blobs(bucket, prefix=_prefix(key), max_results=limit + 8,
                                                           **self._kw())))
        return [f"gs://{bucket}/{b.name}" for b in found if not b.name.endswith("/")][:limit]

    def list_dirs(self, uri: str) -> list[str]:
        bucket, key = split(uri)
        prefix = _prefix(key)

        def folders(c):
            pages = c.list_blobs(bucket, prefix=prefix, delimiter="/", **self._kw())
            for _ in pages:  # the prefixes are known once every page was read
                pass
            return pages.prefixes

        return sorted(p[len(prefix):].rstrip("/") for p in self._call(uri, folders))

    # --- writing ---------------------------------------------------------------------------------
    def _upload(self, uri: str, data: bytes, **condition) -> str:
        blob = self._blob(uri)
        blob.upload_from_string(data, content_type="application/octet-stream", **condition, **self._kw())
        return str(blob.generation)

    def write(self, uri: str, data: bytes) -> str:
        return self._call(uri, lambda _c: self._upload(uri, data))

    def create_tagged(self, uri: str, data: bytes) -> str | None:
        """The upload's answer carries the new generation: the tag without reading the object back."""
        try:
            return self._call(uri, lambda _c: self._upload(uri, data, if_generation_match=0), precondition=True)
        except _PreconditionFailed:
            return None

    def replace_tagged(self, uri: str, data: bytes, tag: str) -> str | None:
        try:
            return self._call(uri, lambda _c: self._upload(uri, data, if_generation_match=int(tag)),
                              precondition=True, missing_ok=True)
        except (_PreconditionFailed, _Missing):
            return None

    def delete(self, uri: str, *, tag: str | None = None) -> bool:
        """False when the object (or the version `tag` names) is gone: GCS says so, unlike S3."""
        kw = {"if_generation_match": int(tag)} if tag is not None else {}
        try:
            self._call(uri, lambda _c: self._blob(uri).delete(**kw, **self._kw()), precondition=True,
                       missing_ok=True)
        except (_PreconditionFailed, _Missing):
            return False
        return True

    def copy(self, source: str, target: str) -> None:
        """Server-side (a rewrite), within the store."""
        (bucket, key), (to_bucket, to_key) = split(source), split(target)

        def rewrite(c):
            source_blob = c.bucket(bucket).blob(key)
            c.bucket(bucket).copy_blob(source_blob, c.bucket(to_bucket), to_key, **self._kw())

        self._call(target, rewrite)

    def delete_tree(self, uri: str) -> None:
        """One listing, then one DELETE per object (the placeholders of folders too)."""
        bucket, key = split(uri)
        names = [b.name for b in self._call(uri, lambda c: list(c.list_blobs(bucket, prefix=_prefix(key),
                                                                            **self._kw())))]
        for name in names:
            try:
                self._call(uri, lambda c, name=name: c.bucket(bucket).blob(name).delete(**self._kw()),
                           missing_ok=True)
            except _Missing:
                pass

    def check_reachable(self, uri: str) -> None:
        """One listing of at most one object under `uri`: the endpoint answers, the credentials are taken
        and the bucket exists. (A listing, not a bucket GET: a key that may read and write objects, such as
        roles/storage.objectAdmin, need not have storage.buckets.get.)"""
        bucket, key = split(uri)
        self._call(uri, lambda c: list(c.list_blobs(bucket, prefix=_prefix(key), max_results=1, **self._kw())),
                   bucket_request=True)

    def not_answering(self) -> None:
        self._silent_until = time.monotonic() + self.options.call_timeout_s

    # --- what the other clients are given --------------------------------------------------------
    def delta_options(self, uri: str) -> dict[str, str] | None:
        """object_store's GCS options: the key file, or for an endpoint without one (an emulator) a key
        naming the endpoint (`gcs_base_url`) with OAuth off, which is how object_store reaches one; the
        same time bounds as the S3 store's."""
        o = self.options.resolved()
        out = {"timeout": _ms(o.request_timeout_s), "connect_timeout": _ms(o.connect_timeout_s),
               "max_retries": str(o.attempts(o.request_timeout_s) - 1),
               "retry_timeout": _ms(max(o.call_timeout_s - o.request_timeout_s, 0.001))}
        if o.endpoint and o.anonymous:
            out["google_service_account_key"] = json.dumps(
                {"gcs_base_url": o.endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
                 "private_key_id": ""})
        elif o.credentials:
            out["google_application_credentials"] = o.credentials
        if o.endpoint and o.endpoint.startswith("http://"):
            out["allow_http"] = "true"
        return out

    def filesystem(self, uri: str):
        bucket, key = split(uri)
        return self.arrow_filesystem(), f"{bucket}/{key}".rstrip("/")

    def spark_conf(self, uri: str | None = None) -> dict[str, str]:
        """The GCS connector's settings (`fs.gs.*`). The connector has no per-bucket settings, so these
        are scheme-wide with or without a URI: every gs:// bucket of one Spark session is reached the
        same way (docs/known-limits.md). Its HTTP client gets the store's connect and read timeouts and
        `attempts - 1` retries."""
        del uri
        o = self.options.resolved()
        out = {f"{_HADOOP}impl": f"{_CONNECTOR}.GoogleHadoopFileSystem",
               "spark.hadoop.fs.AbstractFileSystem.gs.impl": f"{_CONNECTOR}.GoogleHadoopFS",
               f"{_HADOOP}http.connect-timeout": _ms(o.connect_timeout_s),
               f"{_HADOOP}http.read-timeout": _ms(o.request_timeout_s),
               f"{_HADOOP}http.max.retry": str(o.attempts(o.request_timeout_s) - 1),
               # Hadoop 3.5's core-default.xml sets these for its own GCS module with size suffixes ("64m"),
               # which this connector reads as plain numbers (NumberFormatException): the same sizes in bytes
               **{f"{_HADOOP}{k}": str(v) for k, v in _SIZES.items()}}
        if o.endpoint:
            out[f"{_HADOOP}storage.root.url"] = o.endpoint + "/"
            # a rename by copy and delete (rewrite), not GCS's newer objects.move request, which
            # emulators lack (fake-gcs-server answers it 404)
            out[f"{_HADOOP}operation.move.enable"] = "false"
        if o.project:
            out[f"{_HADOOP}project.id"] = o.project
        if o.anonymous:
            out[f"{_HADOOP}auth.type"] = "UNAUTHENTICATED"
        elif o.credentials:
            out[f"{_HADOOP}auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
            out[f"{_HADOOP}auth.service.account.json.keyfile"] = o.credentials
        else:
            out[f"{_HADOOP}auth.type"] = "APPLICATION_DEFAULT"
        return out

    def env(self) -> dict[str, str]:
        return self.options.as_env()

    # --- plumbing ----------------------------------------------------------------------------------
    def _hung(self, uri: str) -> StoreUnavailableError:
        """The one line for a store that did not answer; later calls fail at once for a while."""
        self.not_answering()
        return StoreUnavailableError(
            f"{uri}: the object store at {self.describe()} did not answer within its time bounds "
            f"({self.options.resolved().budget()}): check that it runs and is reachable (or raise "
            "GcsOptions.call_timeout_s / the resource's s3_call_timeout_s)", uri=uri)

    def _call(self, uri: str, request, *, precondition: bool = False, missing_ok: bool = False,
              bucket_request: bool = False, raw: bool = False):
        """One GCS call, with its failures turned into what a caller can act on: a missing object
        (`_Missing`), a failed precondition (`_PreconditionFailed`) or a `StorageError` naming the URI
        and the fix (unreachable endpoint, refused credentials, missing bucket)."""
        import requests
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exc

        where = self.describe()
        if time.monotonic() < self._silent_until:
            raise StoreUnavailableError(
                f"{uri}: the object store at {where} did not answer a moment ago and is not waited on again "
                f"for {self.options.call_timeout_s:g} s: check that it runs and is reachable", uri=uri)
        try:
            out = request(None if raw else self.client())
        except gexc.RetryError as exc:  # the call's budget ran out between attempts
            cause = exc.cause if exc.cause is not None else exc
            if isinstance(cause, (requests.exceptions.Timeout, gexc.RetryError)):
                raise self._hung(uri) from None
            raise StorageError(f"{uri}: {where}: {plain(str(cause))[:300]}", uri=uri) from None
        except gexc.PreconditionFailed:
            if precondition:
                raise _PreconditionFailed() from None
            raise StorageError(f"{uri}: {where} refused a conditional request", uri=uri) from None
        except gexc.NotFound as exc:
            text = str(exc)
            if bucket_request or ("bucket" in text.lower() and "does not exist" in text.lower()):
                raise StorageError(f"{uri}: bucket {split(uri)[0]!r} does not exist on {where}: create it, or fix "
                                   "the lake's URI", uri=uri) from None
            if missing_ok:
                raise _Missing() from None
            raise StorageError(f"{uri}: not found on {where}", uri=uri) from None
        except (gexc.Unauthorized, gexc.Forbidden, auth_exc.RefreshError) as exc:
            code = getattr(exc, "code", None) or "the token request failed"
            raise StorageError(f"{uri}: {where} refused the credentials ({code}): set GOOGLE_APPLICATION_CREDENTIALS "
                               "(or the resource's gcs_credentials) to a key that may read and write this bucket",
                               uri=uri) from None
        except requests.exceptions.Timeout:
            raise self._hung(uri) from None
        except (requests.exceptions.ConnectionError, auth_exc.TransportError):  # refused at once
            raise StoreUnavailableError(
                f"{uri}: cannot connect to the object store at {where}: check that it runs and that the endpoint "
                "(STORAGE_EMULATOR_HOST, or the resource's gcs_endpoint) is right", uri=uri) from None
        except gexc.GoogleAPICallError as exc:
            raise StorageError(f"{uri}: {where} answered {exc.code}: {plain(exc.message or '')[:300]}".rstrip(": "),
                               uri=uri) from None
        self._silent_until = 0.0
        return out


def _refused(exc: BaseException) -> bool:
    """Nobody accepted the connection: nothing to wait out, no retry."""
    import requests

    return (isinstance(exc, requests.exceptions.ConnectionError) and not isinstance(exc, requests.exceptions.Timeout)
            and "Failed to establish a new connection" in str(exc))


def _retry(o: GcsOptions):
    """A retry for one call: transient failures and timeouts, at most `attempts(request_timeout_s)` attempts,
    none started after `call_timeout_s - request_timeout_s`; a refused connection is not retried."""
    import requests
    from google.api_core.retry import Retry, if_transient_error

    left = [o.attempts(o.request_timeout_s) - 1]

    def retryable(exc: BaseException) -> bool:
        if left[0] <= 0 or _refused(exc):
            return False
        if isinstance(exc, requests.exceptions.Timeout) or (isinstance(exc, Exception) and if_transient_error(exc)):
            left[0] -= 1
            return True
        return False

    return Retry(predicate=retryable, initial=0.2, maximum=2.0, multiplier=2.0,
                 timeout=max(o.call_timeout_s - o.request_timeout_s, 0.001))
