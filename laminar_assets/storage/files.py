"""Laminar's own file I/O, on a local folder or an object store, addressed by URI.

Every file Laminar keeps beside the tables (watermarks, leases, sweep progress, staged Parquet
files, Delta log entries it writes itself) goes through these functions, so one code path serves
a local lake and a lake in a bucket:

    local path or file://...   the file system; atomic replace by rename, put-if-absent by O_EXCL
    s3://bucket/key (s3a://)   S3 or an S3-compatible store; put-if-absent by `If-None-Match: *`,
                               compare-and-swap by `If-Match: <ETag>` (an object store has no
                               atomic rename)

`read_tagged` returns a content tag (the ETag, or the file's inode, size and modification time)
that `replace_if` and `delete_if` take: the write happens only if nobody changed the object since.
On a local disk that check and the write are two steps (two writers on one machine are kept
apart by leases created with O_EXCL); on S3 the store does both in one request.

The options of the store (endpoint, credentials) are set once per process with `configure`, or
come from the environment when a client is first made (`ObjectStoreOptions.resolved`).
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from laminar_assets.errors import StorageError

from .options import ObjectStoreOptions

OBJECT_STORE_SCHEMES = ("s3", "s3a")
_UNSUPPORTED = ("gs", "gcs", "abfs", "abfss", "az", "adl", "wasb", "wasbs")

_lock = threading.Lock()
_options: ObjectStoreOptions | None = None


# --- which store -----------------------------------------------------------------------------
def configure(options: ObjectStoreOptions | None) -> None:
    """The object store options of this process (None: from the environment when first needed)."""
    global _options
    with _lock:
        _options = options
        _client.cache_clear()
        _arrow_fs.cache_clear()


def options() -> ObjectStoreOptions:
    """The options object-store URIs are reached with in this process."""
    return _options or ObjectStoreOptions()


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def is_object_store(uri: str) -> bool:
    """True for s3:// (and s3a://) URIs; raises a clear error for object stores not supported yet."""
    s = scheme(uri)
    if s in _UNSUPPORTED:
        raise StorageError(
            f"{uri}: {s}:// is not supported yet. Laminar keeps its watermarks and leases with conditional "
            "writes and tests them on S3; use s3:// (S3 or an S3-compatible store) or a local path", uri=uri)
    return s in OBJECT_STORE_SCHEMES


def local_path(uri: str) -> str | None:
    """The file-system path of a local URI (a plain path or file://), else None."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri if "://" not in uri else None


def normalized(uri: str) -> str:
    """The URI Laminar keeps: s3:// for s3a://, no trailing slash."""
    uri = uri.rstrip("/")
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def resolve_root(root: str) -> str:
    """A storage root as Laminar keeps it: an absolute path, or a normalized object-store URI."""
    return normalized(root) if is_object_store(root) else os.path.abspath(local_path(root))


def join(uri: str, *parts: str) -> str:
    """`uri` and path parts, with '/' (object stores) or the OS separator (local paths)."""
    if local_path(uri) is not None and "://" not in uri:
        return os.path.join(uri, *parts)
    return "/".join([uri.rstrip("/"), *[p.strip("/") for p in parts]])


def spark_uri(uri: str) -> str:
    """The URI Spark reads and writes: file:// for local paths, s3a:// for S3."""
    local = local_path(uri)
    if local is not None:
        return f"file://{os.path.abspath(local)}"
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def delta_options(uri: str) -> dict[str, str] | None:
    """`storage_options` for deltalake on `uri` (None for a local table)."""
    return options().delta_options() if is_object_store(uri) else None


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it, for Parquet reads and writes."""
    if is_object_store(uri):
        bucket, key = _split(uri)
        return _arrow_fs(), f"{bucket}/{key}".rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(local_path(uri))


# --- reading ---------------------------------------------------------------------------------
def read(uri: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    found = read_tagged(uri)
    return found[0] if found else None


def read_tagged(uri: str) -> tuple[bytes, str] | None:
    """The object's bytes and a tag of this version of it (for `replace_if`), or None."""
    local = local_path(uri)
    if local is not None:
        try:
            with open(local, "rb") as fh:
                data = fh.read()
                st = os.fstat(fh.fileno())
        except FileNotFoundError:
            return None
        return data, _local_tag(st)
    bucket, key = _split(uri)
    try:
        got = _call(uri, lambda c: c.get_object(Bucket=bucket, Key=key), missing_ok=True)
    except _Missing:
        return None
    return got["Body"].read(), got["ETag"]


def exists(uri: str) -> bool:
    local = local_path(uri)
    if local is not None:
        return os.path.exists(local)
    bucket, key = _split(uri)
    try:
        _call(uri, lambda c: c.head_object(Bucket=bucket, Key=key), missing_ok=True)
    except _Missing:
        return False
    return True


def list_files(uri: str) -> list[tuple[str, int]]:
    """(URI, size) of every file under the folder `uri`, at any depth, sorted."""
    local = local_path(uri)
    if local is not None:
        out = []
        for dirpath, _dirs, names in os.walk(local):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    out.append((path, os.path.getsize(path)))
                except FileNotFoundError:
                    continue
        return sorted(out)
    bucket, key = _split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    out = []
    for page in _call(uri, lambda c: list(c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))):
        out += [(f"s3://{bucket}/{o['Key']}", int(o["Size"])) for o in page.get("Contents", [])]
    return sorted(out)


def list_tagged(uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
    """(name, tag) of the files directly or deeper under the folder `uri` whose names (relative to it)
    sort after `after` and, when given, not after `until`, in name order. The tags are those
    `read_tagged` gives. On S3 one listing request per 1000 names, starting at `after` (StartAfter):
    what a folder holds before it costs nothing."""
    local = local_path(uri)
    if local is not None:
        out = []
        for path, _size in list_files(uri):
            name = os.path.relpath(path, local).replace(os.sep, "/")
            if name > after and (until is None or name <= until):
                try:
                    out.append((name, _local_tag(os.stat(path))))
                except FileNotFoundError:
                    continue
        return out
    bucket, key = _split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    out, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else ({"StartAfter": prefix + after} if after else {})
        page = _call(uri, lambda c, kw=kw: c.list_objects_v2(Bucket=bucket, Prefix=prefix, **kw))
        for o in page.get("Contents", []):
            name = o["Key"][len(prefix):]
            if until is not None and name > until:
                return out
            out.append((name, o["ETag"]))
        if not page.get("IsTruncated"):
            return out
        token = page.get("NextContinuationToken")


def some_files(uri: str, limit: int) -> list[str]:
    """Up to `limit` files under the folder `uri`, at any depth (URIs; which ones is unspecified): whether a
    folder holds anything, and examples of what, without listing all of a large one."""
    local = local_path(uri)
    if local is not None:
        out: list[str] = []
        for dirpath, _dirs, names in os.walk(local):
            out += [os.path.join(dirpath, n) for n in sorted(names)[:limit - len(out)]]
            if len(out) >= limit:
                break
        return out
    bucket, key = _split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    page = _call(uri, lambda c: c.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=limit))
    return [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]


def list_dirs(uri: str) -> list[str]:
    """The names of the folders directly under `uri`."""
    local = local_path(uri)
    if local is not None:
        if not os.path.isdir(local):
            return []
        return sorted(n for n in os.listdir(local) if os.path.isdir(os.path.join(local, n)))
    bucket, key = _split(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    names: set[str] = set()
    pages = _call(uri, lambda c: list(c.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, Delimiter="/")))
    for page in pages:
        names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
    return sorted(names)


# --- writing ---------------------------------------------------------------------------------
def write(uri: str, data: bytes) -> str:
    """Replace the object with `data`, atomically: a reader sees the old bytes or the new ones.
    Returns the new object's tag (as `read_tagged` would give it), from the write's own answer."""
    local = local_path(uri)
    if local is not None:
        tmp = _local_temp(local, data)
        tag = _local_tag(os.stat(tmp))
        os.replace(tmp, local)
        return tag
    bucket, key = _split(uri)
    return _call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data))["ETag"]


def create(uri: str, data: bytes) -> bool:
    """Write `data` only if the object does not exist yet; False when it does (put-if-absent)."""
    return create_tagged(uri, data) is not None


def create_tagged(uri: str, data: bytes) -> str | None:
    """`create`, returning the tag of the object written (as `read_tagged` would give it) without
    reading it back: on S3 the PUT's answer carries the ETag. None when the object exists."""
    local = local_path(uri)
    if local is not None:
        tmp = _local_temp(local, data)
        try:
            tag = _local_tag(os.stat(tmp))  # a hard link shares the inode, size and modification time
            os.link(tmp, local)  # fails if `local` exists: complete or absent, never half-written
            return tag
        except FileExistsError:
            return None
        finally:
            os.remove(tmp)
    bucket, key = _split(uri)
    try:
        put = _call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"), precondition=True)
    except _PreconditionFailed:
        return None
    return put["ETag"]


def replace_if(uri: str, data: bytes, tag: str) -> bool:
    """Write `data` only if the object is still the version `read_tagged` tagged; False otherwise."""
    return replace_tagged(uri, data, tag) is not None


def replace_tagged(uri: str, data: bytes, tag: str) -> str | None:
    """`replace_if`, returning the new object's tag (None when the object changed or is gone)."""
    local = local_path(uri)
    if local is not None:
        current = read_tagged(uri)
        if current is None or current[1] != tag:
            return None
        tmp = _local_temp(local, data)
        new = _local_tag(os.stat(tmp))
        os.replace(tmp, local)
        return new
    bucket, key = _split(uri)
    try:
        put = _call(uri, lambda c: c.put_object(Bucket=bucket, Key=key, Body=data, IfMatch=tag), precondition=True)
    except (_PreconditionFailed, _Missing):
        return None
    return put["ETag"]


def _local_temp(local: str, data: bytes) -> str:
    """A new file beside `local` holding `data`, flushed to disk (to be renamed or linked into place)."""
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    tmp = f"{local}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def _local_tag(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"


def delete(uri: str, *, tag: str | None = None) -> bool:
    """Delete the object (only the version `tag` names, when given). False when `tag` is given and the
    object changed or is gone (without a tag, S3 answers alike whether it was there or not)."""
    local = local_path(uri)
    if local is not None:
        if tag is not None:
            current = read_tagged(uri)
            if current is None or current[1] != tag:
                return False
        try:
            os.remove(local)
            return True
        except FileNotFoundError:
            return False
    bucket, key = _split(uri)
    kw = {"IfMatch": tag} if tag is not None else {}
    try:
        _call(uri, lambda c: c.delete_object(Bucket=bucket, Key=key, **kw), precondition=True, missing_ok=True)
    except (_PreconditionFailed, _Missing):
        return False
    return True


def copy(source: str, target: str) -> None:
    """Copy an object within the store (server-side on S3; a hard link, else a copy, on a local disk)."""
    local, into = local_path(source), local_path(target)
    if local is not None and into is not None:
        import shutil

        os.makedirs(os.path.dirname(into) or ".", exist_ok=True)
        try:
            os.link(local, into)
        except OSError:
            shutil.copyfile(local, into)
        return
    (bucket, key), (to_bucket, to_key) = _split(source), _split(target)
    _call(target, lambda c: c.copy_object(CopySource={"Bucket": bucket, "Key": key}, Bucket=to_bucket, Key=to_key))


def delete_tree(uri: str) -> None:
    """Delete every file under the folder `uri` (a staging nothing committed)."""
    local = local_path(uri)
    if local is not None:
        import shutil

        shutil.rmtree(local, ignore_errors=True)
        return
    bucket, _ = _split(uri)
    keys = [u[len(f"s3://{bucket}/"):] for u, _ in list_files(uri)]
    for i in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[i:i + 1000]]
        _call(uri, lambda c, batch=batch: c.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True}))


def remove_empty_dirs(uri: str, up_to: str) -> None:
    """Remove `uri` and its parents while empty, up to (not including) `up_to` (local folders only:
    an object store has no folders)."""
    local, stop = local_path(uri), local_path(up_to)
    if local is None or stop is None:
        return
    stop = os.path.abspath(stop)
    current = os.path.abspath(local)
    while current.startswith(stop + os.sep):
        try:
            os.rmdir(current)
        except OSError:  # not empty (another staging's files), or gone
            return
        current = os.path.dirname(current)


# --- checks ------------------------------------------------------------------------------------
def check_reachable(uri: str) -> None:
    """Raise a `StorageError` that says what to fix, within seconds, when the store of `uri` cannot
    be reached, refuses the credentials or has no such bucket. Writes nothing."""
    if not is_object_store(uri):
        return
    bucket, _ = _split(uri)
    _call(uri, lambda c: c.head_bucket(Bucket=bucket), bucket_request=True)


# --- S3 plumbing ---------------------------------------------------------------------------------
class _Missing(Exception):
    pass


class _PreconditionFailed(Exception):
    pass


def _split(uri: str) -> tuple[str, str]:
    parts = urlsplit(normalized(uri))
    return parts.netloc, parts.path.lstrip("/")


@functools.lru_cache(maxsize=1)
def _client():
    return options().client()


@functools.lru_cache(maxsize=1)
def _arrow_fs() -> pafs.FileSystem:
    return options().arrow_filesystem()


def _call(uri: str, request, *, precondition: bool = False, missing_ok: bool = False, bucket_request: bool = False):
    """One S3 request, with its failures turned into what a caller can act on: a missing object
    (`_Missing`), a failed precondition (`_PreconditionFailed`) or a `StorageError` naming the URI
    and the fix (unreachable endpoint, refused credentials, missing bucket)."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    where = options().describe()
    try:
        return request(_client())
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, status = str(error.get("Code", "")), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if precondition and (status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")):
            raise _PreconditionFailed() from None
        if code == "NoSuchBucket" or (bucket_request and (status == 404 or code in ("404", "NotFound"))):
            raise StorageError(f"{uri}: bucket {_split(uri)[0]!r} does not exist on {where}: create it, or fix the "
                               "lake's URI", uri=uri) from None
        if missing_ok and (status == 404 or code in ("NoSuchKey", "404", "NotFound")):
            raise _Missing() from None
        if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            raise StorageError(f"{uri}: {where} refused the credentials ({code or status}): set AWS_ACCESS_KEY_ID and "
                               "AWS_SECRET_ACCESS_KEY (or a profile, or the resource's credentials) to a key that may "
                               "read and write this bucket", uri=uri) from None
        raise StorageError(f"{uri}: {where} answered {code or status}: {error.get('Message', '')}".rstrip(": "),
                           uri=uri) from None
    except NoCredentialsError:
        raise StorageError(f"{uri}: no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                           "AWS_PROFILE, or the resource's credentials", uri=uri) from None
    except EndpointConnectionError:
        raise StorageError(f"{uri}: cannot connect to {where}: check that the store runs and that the endpoint "
                           "(AWS_ENDPOINT_URL, or the resource's endpoint) is right", uri=uri) from None
    except BotoCoreError as exc:
        raise StorageError(f"{uri}: {where}: {exc}", uri=uri) from None
