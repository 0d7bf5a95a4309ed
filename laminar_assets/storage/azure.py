"""`AzureStore`: a lake in Azure Blob Storage / ADLS Gen2 (abfss://container@account.dfs.core.windows.net/path).

Which URIs. Laminar keeps `abfss://<container>@<account>.dfs.core.windows.net/<path>`, the form Spark's
ABFS connector, deltalake and the Azure docs use: the URI names the account, so two accounts (or an
account and an emulator) live side by side, each reached with its own options. It also takes, and
normalises to that form (as s3a:// becomes s3://):

    abfs://container@account.dfs.core.windows.net/path     (the same without TLS in Hadoop's naming)
    abfss://container@account.blob.core.windows.net/path   (the blob host of the same account)
    wasbs:// and wasb:// with either host                  (Hadoop's retired WASB names)
    az://container/path                                    (deltalake's and fsspec's short form: the account
                                                            from AZURE_STORAGE_ACCOUNT_NAME, read when used)

Conditional writes with ETags, checked by the service in the same request as the write:
create-if-absent `If-None-Match: *`, replace `If-Match: <etag>`, delete `If-Match: <etag>`
(azure-storage-blob's `match_condition`). Every object Laminar writes itself is one Put Blob (no
blocks), so a reader sees the old bytes or the new.

Options (`AzureOptions`): `endpoint` (an emulator or a private endpoint, e.g. Azurite's
`http://127.0.0.1:10000`: URLs are then `<endpoint>/<account>/<container>/<blob>`, the emulator's
path style; None: `https://<account>.blob.core.windows.net`), the account key or a SAS token, and
the same four time bounds as an S3 store (`options.ObjectStoreOptions`). Unset fields come from
AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_KEY), AZURE_STORAGE_SAS_TOKEN and
AZURE_STORAGE_ENDPOINT when a client is made, never at import. Secrets never appear in `repr`,
logs or messages.

What the other clients get:
    deltalake   object_store's azure_* keys (account, key or SAS, endpoint, allow_http) and the time bounds
    pyarrow     `pyarrow.fs.AzureFileSystem` (pyarrow >= 16) on the account; it has no timeout settings
                (docs/known-limits.md)
    Spark       hadoop-azure's ABFS (jar group `azure`): `fs.azure.account.key.<host>`, its timeouts and
                retries; on an emulator, ABFS's blob-endpoint client (`fs.azure.fns.account.service.type`
                BLOB) through `fs.azure.abfs.endpoint`, since Azurite has no DFS endpoint (`spark_uri`)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from laminar_assets.errors import StorageError, StoreUnavailableError

from .messages import plain
from .options import ObjectStoreOptions, TimeBounds, _ms

# The hosts of Azure's public cloud; sovereign clouds (…core.chinacloudapi.cn, …) keep their own suffix.
DFS, BLOB = ".dfs.core.windows.net", ".blob.core.windows.net"
EMULATOR_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (documented by Microsoft; not a secret)
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_HADOOP = "spark.hadoop.fs.azure."
# Put Blob takes up to 5000 MiB in one request: every object Laminar writes itself is one atomic request
_ONE_REQUEST = 256 * 1024 * 1024

_ENV = {  # field -> environment variables, first set wins
    "endpoint": ("AZURE_STORAGE_ENDPOINT",),
    "account_key": ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"),
    "sas_token": ("AZURE_STORAGE_SAS_TOKEN",),
}


@dataclass(frozen=True)
class AzureOptions(TimeBounds):
    """How to reach Azure Blob Storage (or an emulator); the account is the URI's. All optional."""

    endpoint: str | None = None  # an emulator's or private endpoint: http://127.0.0.1:10000 (URLs endpoint/account/...)
    account_key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    # and the time bounds of `TimeBounds`, as `ObjectStoreOptions`'s

    @classmethod
    def of(cls, options: AzureOptions | ObjectStoreOptions | None) -> AzureOptions:
        """Azure options from what a caller gave: these, an S3-style `ObjectStoreOptions` (a resource or an
        engine built for any store: only its time bounds apply here), or None (the environment's)."""
        if isinstance(options, AzureOptions):
            return options
        if isinstance(options, ObjectStoreOptions):
            return cls(**options.bounds())
        return cls()

    def resolved(self) -> AzureOptions:
        """Unset fields from the environment (read now, not at import)."""
        return self._from_env(_ENV)

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def blob_url(self, account: str) -> str:
        """The blob service URL of `account`: the endpoint's path style, else Azure's host."""
        if self.endpoint:
            return f"{self.endpoint.rstrip('/')}/{account}"
        return f"https://{account}{BLOB}"


# --- URIs ------------------------------------------------------------------------------------------
def split(uri: str) -> tuple[str, str, str]:
    """(account, container, blob path) of an Azure URI in any accepted form (see the module's docstring)."""
    scheme, _, rest = uri.partition("://")
    scheme = scheme.lower()
    authority, _, path = rest.partition("/")
    path = path.strip("/")
    if scheme == "az" and "@" not in authority:
        account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or os.environ.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            raise StorageError(f"{uri}: an az:// URI names no storage account: set AZURE_STORAGE_ACCOUNT_NAME, or "
                               "write abfss://<container>@<account>.dfs.core.windows.net/<path>", uri=uri)
        return account, authority, path
    container, at, host = authority.partition("@")
    if not at or not container or not host:
        raise StorageError(f"{uri}: an Azure URI names its container and account: "
                           "abfss://<container>@<account>.dfs.core.windows.net/<path>", uri=uri)
    return host.split(".", 1)[0], container, path


def _dfs_host(uri: str) -> str:
    """The DFS host the URI names (the blob host of the same account taken to its DFS twin)."""
    authority = uri.partition("://")[2].partition("/")[0]
    host = authority.partition("@")[2]
    if not host or "." not in host:
        account, _, _ = split(uri)
        return f"{account}{DFS}"
    account, _, suffix = host.partition(".")
    return f"{account}.{suffix.replace('blob.', 'dfs.', 1) if suffix.startswith('blob.') else suffix}"


def canonical(uri: str) -> str:
    """The URI Laminar keeps: abfss://container@account.dfs.core.windows.net/path (no trailing slash); a
    bare scheme (`abfss://`, a mount for every Azure URI) stays a bare `abfss://`."""
    rest = uri.partition("://")[2].strip("/")
    if not rest:
        return "abfss://"
    account, container, path = split(uri)
    host = _dfs_host(uri) if "@" in rest.partition("/")[0] else f"{account}{DFS}"
    return f"abfss://{container}@{host}" + (f"/{path}" if path else "")


class _Missing(Exception):
    pass


class _PreconditionFailed(Exception):
    pass


class AzureStore:
    """Azure Blob Storage (and ADLS Gen2, and Azurite), reached with `options` (default: the environment)."""

    schemes: ClassVar[tuple[str, ...]] = ("abfss", "abfs", "az", "wasbs", "wasb")
    spark_scheme: ClassVar[str | None] = "abfss"
    jars: ClassVar[str | None] = "azure"
    object_store: ClassVar[bool] = True

    def __init__(self, options: AzureOptions | ObjectStoreOptions | None = None) -> None:
        self.options = AzureOptions.of(options)
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], tuple[AzureOptions, Any]] = {}
        self._silent_until = 0.0

    def __eq__(self, other: object) -> bool:
        return type(other) is AzureStore and other.options == self.options

    def __hash__(self) -> int:
        return hash((AzureStore, self.options))

    def __repr__(self) -> str:
        return f"AzureStore({self.options!r})"

    def describe(self) -> str:
        o = self.options.resolved()
        return o.endpoint or "Azure Blob Storage"

    def where(self, uri: str) -> str:
        """The service URL of `uri`'s account (no secrets)."""
        try:
            return self.options.resolved().blob_url(split(uri)[0])
        except StorageError:
            return self.describe()

    canonical = staticmethod(canonical)

    # --- clients ---------------------------------------------------------------------------------
    def _made(self, kind: str, account: str, make):
        resolved = self.options.resolved()
        with self._lock:
            found = self._clients.get((kind, account))
            if found is None or found[0] != resolved:
                found = self._clients[(kind, account)] = (resolved, make(resolved, account))
            return found[1]

    def service(self, account: str):
        """azure-storage-blob's client of `account`, held to the time bounds."""
        return self._made("blob", account, _service_client)

    def container(self, uri: str):
        account, container, _ = split(uri)
        return self.service(account).get_container_client(container)

    def blob(self, uri: str):
        account, container, path = split(uri)
        return self.service(account).get_blob_client(container, path)

    # --- reading ---------------------------------------------------------------------------------
    def read_tagged(self, uri: str) -> tuple[bytes, str] | None:
        blob = self.blob(uri)

        def get(_):
            download = blob.download_blob()
            return download.readall(), _tag(download.properties.etag)

        try:
            return self._call(uri, get, missing_ok=True)
        except _Missing:
            return None

    def exists(self, uri: str) -> bool:
        blob = self.blob(uri)
        try:
            self._call(uri, lambda _: blob.get_blob_properties(), missing_ok=True)
        except _Missing:
            return False
        return True

    def _prefix(self, uri: str) -> tuple[str, str]:
        """The container's URI as Laminar keeps it (with a slash), and the blob-name prefix of `uri`'s folder."""
        _, container, path = split(uri)
        root = canonical(uri)
        return root[:len(root) - len(path)].rstrip("/") + "/", (path + "/" if path else "")

    def _listing(self, uri: str) -> tuple[str, str, list]:
        """The container's URI, the folder's blob-name prefix, and every blob under it (with metadata:
        ABFS's folder markers are told apart by it)."""
        base, prefix = self._prefix(uri)
        container = self.container(uri)
        blobs = self._call(uri, lambda _: list(container.list_blobs(name_starts_with=prefix or None,
                                                                    include=["metadata"])))
        return base, prefix, blobs

    def list_files(self, uri: str) -> list[tuple[str, int]]:
        base, _, blobs = self._listing(uri)
        return sorted((base + b.name, int(b.size)) for b in blobs if not _is_folder(b))

    def list_tagged(self, uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
        """Azure's List Blobs has no start-after: one listing of the folder (a request per 5000 names),
        the names up to `after` dropped here."""
        _, prefix, blobs = self._listing(uri)
        out = []
        for b in sorted(blobs, key=lambda b: b.name):
            name = b.name[len(prefix):]
            if _is_folder(b) or name <= after:
                continue
            if until is not None and name > until:
                break
            out.append((name, _tag(b.etag)))
        return out

    def some_files(self, uri: str, limit: int) -> list[str]:
        base, prefix = self._prefix(uri)
        container = self.container(uri)

        def first(_):
            out = []
            for b in container.list_blobs(name_starts_with=prefix or None, include=["metadata"],
                                          results_per_page=limit):
                if not _is_folder(b):
                    out.append(base + b.name)
                if len(out) >= limit:
                    break
            return out

        return self._call(uri, first)

    def list_dirs(self, uri: str) -> list[str]:
        _, prefix = self._prefix(uri)
        container = self.container(uri)
        items = self._call(uri, lambda _: list(container.walk_blobs(name_starts_with=prefix or None, delimiter="/")))
        return sorted({i.name[len(prefix):].rstrip("/") for i in items if i.name.endswith("/")})

    # --- writing ---------------------------------------------------------------------------------
    def write(self, uri: str, data: bytes) -> str:
        blob = self.blob(uri)
        return _tag(self._call(uri, lambda _: blob.upload_blob(data, overwrite=True, length=len(data)))["etag"])

    def create_tagged(self, uri: str, data: bytes) -> str | None:
        """`If-None-Match: *`: the service refuses the write when the blob exists (409 or 412)."""
        from azure.core import MatchConditions

        blob = self.blob(uri)
        try:
            put = self._call(uri, lambda _: blob.upload_blob(data, overwrite=True, length=len(data),
                                                             match_condition=MatchConditions.IfMissing),
                             precondition=True)
        except _PreconditionFailed:
            return None
        return _tag(put["etag"])

    def replace_tagged(self, uri: str, data: bytes, tag: str) -> str | None:
        """`If-Match: <etag>`: the write happens only on the version the tag names."""
        from azure.core import MatchConditions

        blob = self.blob(uri)
        try:
            put = self._call(uri, lambda _: blob.upload_blob(data, overwrite=True, length=len(data), etag=tag,
                                                             match_condition=MatchConditions.IfNotModified),
                             precondition=True, missing_ok=True)
        except (_PreconditionFailed, _Missing):
            return None
        return _tag(put["etag"])

    def delete(self, uri: str, *, tag: str | None = None) -> bool:
        """Without a tag, a blob already gone counts as deleted (True), as on S3."""
        from azure.core import MatchConditions

        blob = self.blob(uri)
        kw = {"etag": tag, "match_condition": MatchConditions.IfNotModified} if tag is not None else {}
        try:
            self._call(uri, lambda _: blob.delete_blob(**kw), precondition=True, missing_ok=True)
        except _PreconditionFailed:
            return False
        except _Missing:
            return tag is None
        return True

    def copy(self, source: str, target: str) -> None:
        """Server-side (Copy Blob within the account), waited on until done within the call's budget."""
        if split(source)[0] != split(target)[0]:
            raise StorageError(f"{source} -> {target}: a copy stays within one storage account", uri=target)
        src, dst = self.blob(source), self.blob(target)
        deadline = time.monotonic() + self.options.call_timeout_s

        def run(_):
            status = dst.start_copy_from_url(src.url).get("copy_status")
            while status == "pending":
                if time.monotonic() > deadline:
                    dst.abort_copy(dst.get_blob_properties().copy.id)
                    raise StoreUnavailableError(f"{target}: the copy from {source} did not finish within "
                                                f"{self.options.call_timeout_s:g} s on {self.where(target)}",
                                                uri=target)
                time.sleep(0.1)
                status = dst.get_blob_properties().copy.status
            if status != "success":
                raise StorageError(f"{target}: the copy from {source} ended {status} on {self.where(target)}",
                                   uri=target)

        self._call(target, run)

    def delete_tree(self, uri: str) -> None:
        """One listing, then a Blob Batch request per 256 blobs."""
        _, _, blobs = self._listing(uri)
        container = self.container(uri)
        names = [b.name for b in blobs]
        # deepest first: a folder marker (ADLS Gen2) goes after what it holds
        names.sort(key=lambda n: (-n.count("/"), n))
        for i in range(0, len(names), 256):
            batch = names[i:i + 256]
            self._call(uri, lambda _, batch=batch: list(container.delete_blobs(*batch, raise_on_any_failure=False)))

    def check_reachable(self, uri: str) -> None:
        container = self.container(uri)
        self._call(uri, lambda _: container.get_container_properties(), container_request=True)

    def not_answering(self) -> None:
        self._silent_until = time.monotonic() + self.options.call_timeout_s

    # --- what the other clients are given --------------------------------------------------------
    def delta_options(self, uri: str) -> dict[str, str] | None:
        """object_store's Azure keys. With an endpoint, object_store builds `<endpoint>/<container>/<blob>`
        URLs: the endpoint given is the account's (`<endpoint>/<account>`), the emulator's path style."""
        o = self.options.resolved()
        account = split(uri)[0]
        out = {"azure_storage_account_name": account, "timeout": _ms(o.request_timeout_s),
               "connect_timeout": _ms(o.connect_timeout_s), "max_retries": str(o.attempts(o.request_timeout_s) - 1),
               "retry_timeout": _ms(max(o.call_timeout_s - o.request_timeout_s, 0.001))}
        if o.endpoint:
            out["azure_storage_endpoint"] = o.blob_url(account)
        if o.allow_http:
            out["azure_allow_http"] = "true"
        if o.account_key:
            out["azure_storage_account_key"] = o.account_key
        elif o.sas_token:
            out["azure_storage_sas_key"] = o.sas_token.lstrip("?")
        return out

    def filesystem(self, uri: str):
        """pyarrow's AzureFileSystem on the account; paths are `container/blob`."""
        account, container, path = split(uri)
        return self._made("arrow", account, _arrow_filesystem), f"{container}/{path}".rstrip("/")

    def spark_uri(self, uri: str) -> str:
        """The URI Spark reads: the abfss:// URI on Azure; on an emulator (`endpoint`, plain http), abfs://
        (Azurite has no DFS endpoint: `spark_conf` points ABFS's blob-endpoint client at it)."""
        if not self.options.resolved().endpoint:
            return canonical(uri)
        return "abfs://" + canonical(uri).split("://", 1)[1]

    def spark_conf(self, uri: str | None = None) -> dict[str, str]:
        """hadoop-azure's ABFS settings: the time bounds scheme-wide, and with a URI its account's own keys
        (`fs.azure.*.<account host>`, which ABFS reads before the scheme-wide ones), so accounts with
        different keys or an emulator beside a real account share one Spark session."""
        o = self.options.resolved()
        attempt = o.request_timeout_s
        conf = {f"{_HADOOP}http.connection.timeout": _ms(o.connect_timeout_s, unit=False),
                f"{_HADOOP}http.read.timeout": _ms(attempt, unit=False),
                f"{_HADOOP}io.retry.max.retries": str(o.attempts(attempt) - 1),
                f"{_HADOOP}io.retry.min.backoff.interval": "500",
                f"{_HADOOP}io.retry.max.backoff.interval": "2000",
                f"{_HADOOP}io.retry.backoff.interval": "500",
                f"{_HADOOP}static.retry.interval": "500"}
        if not uri or not uri.partition("://")[2].strip("/"):
            if o.account_key:
                conf[f"{_HADOOP}account.key"] = o.account_key
            return conf
        account = split(uri)[0]
        # the DFS host also on an emulator: ABFS finds the account (the emulator's path) only in a DFS host name
        host = _dfs_host(uri) if "@" in uri else f"{account}{DFS}"
        own: dict[str, str] = {}
        if o.endpoint:
            authority = o.endpoint.split("://", 1)[1].rstrip("/")
            own.update({"abfs.endpoint": authority, "always.use.https": str(not o.allow_http).lower(),
                        # Azurite speaks the blob API only: ABFS's blob-endpoint client, flat namespace
                        "account.hns.enabled": "false", "fns.account.service.type": "BLOB",
                        "ingress.service.type": "BLOB",
                        # ABFS's Apache HTTP client needs a TLS socket factory even for http://: the JDK's
                        "networking.library": "JDK_HTTP_URL_CONNECTION"})
        if o.account_key:
            own.update({"account.auth.type": "SharedKey", "account.key": o.account_key})
        elif o.sas_token:
            own.update({"account.auth.type": "SAS", "sas.fixed.token": o.sas_token.lstrip("?")})
        conf.update({f"{_HADOOP}{k}.{host}": v for k, v in own.items()})
        if o.allow_http:
            # ABFS reads this one for the whole scheme only (no per-account key); it concerns abfs:// URIs
            # alone (abfss:// is always TLS), which Laminar gives Spark only on an emulator
            conf[f"{_HADOOP}always.use.https"] = "false"
        return conf

    def env(self) -> dict[str, str]:
        o = self.options.resolved()
        pairs = {"AZURE_STORAGE_ENDPOINT": o.endpoint, "AZURE_STORAGE_ACCOUNT_KEY": o.account_key,
                 "AZURE_STORAGE_SAS_TOKEN": o.sas_token}
        return {k: v for k, v in pairs.items() if v}

    # --- plumbing ----------------------------------------------------------------------------------
    def _call(self, uri: str, request, *, precondition: bool = False, missing_ok: bool = False,
              container_request: bool = False):
        """One Azure request, its failures turned into what a caller can act on (as `S3Store._call`)."""
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        where = self.where(uri)
        if time.monotonic() < self._silent_until:
            raise StoreUnavailableError(
                f"{uri}: the object store at {where} did not answer a moment ago and is not waited on again "
                f"for {self.options.call_timeout_s:g} s: check that it runs and is reachable", uri=uri)
        try:
            out = request(None)
        except (ResourceModifiedError, ResourceExistsError) as exc:
            if precondition:
                raise _PreconditionFailed() from None
            raise StorageError(f"{uri}: {where} answered {_code(exc)}", uri=uri) from None
        except ResourceNotFoundError as exc:
            code = _code(exc)
            if code == "ContainerNotFound" or container_request:
                raise StorageError(f"{uri}: container {split(uri)[1]!r} does not exist on {where}: create it, or "
                                   "fix the lake's URI", uri=uri) from None
            if missing_ok:
                raise _Missing() from None
            raise StorageError(f"{uri}: {where} answered {code}", uri=uri) from None
        except ClientAuthenticationError as exc:
            raise StorageError(f"{uri}: {where} refused the credentials ({_code(exc)}): set AZURE_STORAGE_ACCOUNT_KEY "
                               "(or AZURE_STORAGE_SAS_TOKEN, or the resource's azure_* credentials) to a key that "
                               "may read and write this container", uri=uri) from None
        except HttpResponseError as exc:
            status = getattr(exc, "status_code", None)
            if precondition and status in (409, 412):
                raise _PreconditionFailed() from None
            if status in (401, 403):
                raise StorageError(f"{uri}: {where} refused the credentials ({_code(exc)}): set "
                                   "AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN, or the resource's azure_* "
                                   "credentials) to a key that may read and write this container", uri=uri) from None
            raise StorageError(f"{uri}: {where} answered {_code(exc)}", uri=uri) from None
        except ServiceResponseError:  # connected, then no answer within the attempts (a read timeout)
            self.not_answering()
            raise StoreUnavailableError(
                f"{uri}: the object store at {where} did not answer within its time bounds "
                f"({self.options.budget()}): check that it runs and is reachable (or raise "
                "AzureOptions.call_timeout_s / the resource's s3_call_timeout_s)", uri=uri) from None
        except ServiceRequestError as exc:  # refused, or no connection within connect_timeout_s
            if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
                self.not_answering()
            raise StoreUnavailableError(
                f"{uri}: cannot connect to the object store at {where}: check that it runs and that the endpoint "
                "(AZURE_STORAGE_ENDPOINT, or the resource's azure_endpoint) is right", uri=uri) from None
        except _NoCredentials:
            raise StorageError(f"{uri}: no credentials for {where}: set AZURE_STORAGE_ACCOUNT_KEY or "
                               "AZURE_STORAGE_SAS_TOKEN, or the resource's azure_account_key / azure_sas_token",
                               uri=uri) from None
        self._silent_until = 0.0
        return out


class _NoCredentials(Exception):
    pass


def _code(exc) -> str:
    code = getattr(exc, "error_code", None) or getattr(exc, "status_code", None) or type(exc).__name__
    return plain(str(getattr(code, "value", code)))  # the service's own word (AuthorizationFailure), not an enum


def _tag(etag: str) -> str:
    """An ETag as the service sends it in headers (quoted): listings give it bare, reads and writes quoted."""
    return etag if etag.startswith('"') else f'"{etag}"'


def _is_folder(blob) -> bool:
    """An ABFS / ADLS Gen2 folder marker (a blob with metadata hdi_isfolder=true), not a file."""
    return str((getattr(blob, "metadata", None) or {}).get("hdi_isfolder", "")).lower() == "true"


def _credential(o: AzureOptions, account: str):
    if o.account_key:
        return {"account_name": account, "account_key": o.account_key}
    if o.sas_token:
        from azure.core.credentials import AzureSasCredential

        return AzureSasCredential(o.sas_token.lstrip("?"))
    return None


def _service_client(o: AzureOptions, account: str):
    """A BlobServiceClient of `account`: connect and read timeouts per attempt, the attempts that fit the
    call's budget, one Put Blob per write. Without a key or SAS token every call is refused at once."""
    from azure.storage.blob import BlobServiceClient, LinearRetry

    credential = _credential(o, account)
    retries = o.attempts(o.request_timeout_s) - 1
    # the SDK's default policy waits 15 s, then 45 s, between attempts: half a second here, so the
    # attempts fit in call_timeout_s and a refused connection fails within a second or two
    policy = LinearRetry(backoff=0.5, random_jitter_range=0,  # type: ignore[arg-type]  # (typed int; it sleeps it) retry_total=retries, retry_connect=retries,
                         retry_read=retries, retry_status=retries)
    client = BlobServiceClient(o.blob_url(account), credential=credential, connection_timeout=o.connect_timeout_s,
                               read_timeout=o.request_timeout_s, retry_policy=policy,
                               max_single_put_size=_ONE_REQUEST, max_single_get_size=_ONE_REQUEST)
    if credential is None:
        return _Unauthenticated()
    return client


class _Unauthenticated:
    """Stands for a client when no credential is known: every call says so in one line."""

    def __getattr__(self, name):
        if name.startswith("get_") and name.endswith("_client"):
            return lambda *args, **kwargs: _Unauthenticated()
        raise _NoCredentials()


def _arrow_filesystem(o: AzureOptions, account: str):
    import pyarrow.fs as pafs

    if not hasattr(pafs, "AzureFileSystem"):
        raise StorageError("pyarrow.fs.AzureFileSystem is missing: Azure lakes need pyarrow >= 16 built with Azure "
                           "support (the PyPI wheels are)")
    kw: dict[str, Any] = {}
    if o.endpoint:
        scheme, _, authority = o.endpoint.partition("://")
        kw.update(blob_storage_authority=authority.rstrip("/"), blob_storage_scheme=scheme,
                  dfs_storage_authority=authority.rstrip("/"), dfs_storage_scheme=scheme)
    if o.account_key:
        kw["account_key"] = o.account_key
    elif o.sas_token:
        kw["sas_token"] = o.sas_token.lstrip("?")
    return pafs.AzureFileSystem(account, **kw)
