"""How to reach an object store: endpoint, region, credentials, addressing and time bounds.

One `ObjectStoreOptions` feeds every client Laminar uses on a bucket, so they all reach the same
store the same way: `deltalake` (storage options), pyarrow's S3 filesystem (Parquet files, the
Delta log), boto3 (conditional writes of watermarks and leases) and Spark's s3a (Hadoop settings).

Unset fields fall back to the usual places when a client is made, never at import time: the AWS
environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`), then the SDKs' own chain (profiles,
instance roles). Secrets never appear in `repr`, logs or error messages.

Time bounds. A store that stops answering (a frozen server, a dropped network) must fail a call, and
so the run, within a known time, never hang it: every client gets the same four numbers.

    connect_timeout_s   3 s    to open a connection (s3a: at least 15 s, Hadoop's floor)
    request_timeout_s   10 s   one attempt with no answer (no byte) for this long is abandoned
                               (s3a: at least 15 s, Hadoop's floor)
    max_attempts        3      attempts per call (transient failures, throttling, timeouts)
    call_timeout_s      30 s   the most one call takes in all: the attempts that fit in it are made

`attempts()` says how many attempts of `per_attempt` seconds fit in `call_timeout_s` (at least one,
at most `max_attempts`), and each client is held to that:

    boto3        connect/read timeouts, standard retry mode with `attempts(request_timeout_s)` attempts
    deltalake    object_store's `timeout` (a whole request), `connect_timeout`, `max_retries` and
                 `retry_timeout` (no retry starts after `call_timeout_s - request_timeout_s`)
    pyarrow      connect and request (no-progress) timeouts, `attempts(request_timeout_s)` attempts
    Spark s3a    establish and socket timeouts, `connection.request.timeout` (the whole attempt,
                 SDK retries included: the SDK itself does not retry), and S3A's own retries
                 (`retry.limit`) for `attempts(max(request_timeout_s, 15))` attempts in all

So with the defaults a call on a store that accepts connections but never answers fails after about
30 s (boto3: 3 x 10 s; s3a: 2 x 15 s), and an endpoint nobody listens at fails at once. A run may meet
the hung store in two s3a calls before it fails (Spark's reader checks a path, then reads its status):
measured 63 s with the defaults (docs/deploying.md, "Time bounds"). A Spark task
is attempted `spark.task.maxFailures` times (1 in local mode): on a cluster a hung store costs that
many call budgets (docs/known-limits.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

# Hadoop's floor for every s3a timeout (MINIMUM_NETWORK_OPERATION_DURATION in hadoop-aws 3.4+).
S3A_FLOOR_S = 15.0


def _ms(seconds: float, *, unit: bool = True) -> str:
    """`seconds` in whole milliseconds: '2500ms' (object_store's duration syntax), or '2500' for Hadoop."""
    ms = max(int(round(seconds * 1000)), 1)
    return f"{ms}ms" if unit else str(ms)


_ENV = {  # field -> environment variables, first set wins
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "profile": ("AWS_PROFILE",),
}


@dataclass(frozen=True, kw_only=True)
class TimeBounds:
    """The time bounds every object store's options share (see "Time bounds" in the module's docstring):
    how long to wait for a connection, how long one attempt may go without an answer, how many attempts
    a call makes, and the most one call (all its attempts and the waits between them) may take before
    it fails. Keyword-only, so each store's own fields keep their places."""

    connect_timeout_s: float = 3.0
    request_timeout_s: float = 10.0
    max_attempts: int = 3
    call_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        from laminar_assets.errors import StorageError

        kind = type(self).__name__
        for name in ("connect_timeout_s", "request_timeout_s", "call_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise StorageError(f"{kind}.{name} must be a number of seconds > 0, not {value!r}")
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise StorageError(f"{kind}.max_attempts must be a whole number >= 1, not {self.max_attempts!r}")

    def bounds(self) -> dict[str, Any]:
        """The four bounds by name (to build another store's options with the same ones)."""
        return {f: getattr(self, f) for f in ("connect_timeout_s", "request_timeout_s", "max_attempts",
                                              "call_timeout_s")}

    def attempts(self, per_attempt: float) -> int:
        """How many attempts of `per_attempt` seconds fit in one call's budget (`call_timeout_s`): at
        least one, at most `max_attempts`."""
        fit = int(self.call_timeout_s // max(per_attempt, 0.001))
        return max(1, min(self.max_attempts, fit))

    def budget(self, client: str = "python") -> str:
        """The time bounds in words, for messages (`client`: which client's; a store whose clients have
        other floors, s3a's, says so in its own)."""
        del client
        return (f"{self.attempts(self.request_timeout_s)} attempt(s) of {self.request_timeout_s:g} s, "
                f"{self.call_timeout_s:g} s in all")

    def _from_env(self, variables: dict[str, tuple[str, ...]]):
        """These options with each unset field of `variables` (field -> environment variables, the first
        set wins) taken from the environment, read now (never at import)."""
        found: dict[str, Any] = {}
        for name, names in variables.items():
            if getattr(self, name) is None:
                value = next((os.environ[v] for v in names if os.environ.get(v)), None)
                if value is not None:
                    found[name] = value
        return replace(self, **found) if found else self


@dataclass(frozen=True)
class ObjectStoreOptions(TimeBounds):
    """Where an S3-compatible store is and how to talk to it (keyword options; all optional)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:9000 for a local or S3-compatible store
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    # Path-style addressing (http://host/bucket/key): what S3-compatible servers need. None: on
    # exactly when a custom endpoint is set.
    path_style: bool | None = None
    # and the time bounds of `TimeBounds` (connect_timeout_s, request_timeout_s, max_attempts, call_timeout_s)

    def resolved(self) -> ObjectStoreOptions:
        """These options with unset fields taken from the environment (read now, not at import)."""
        out = self._from_env(_ENV)
        if out.region is None:
            out = replace(out, region="us-east-1")  # what S3-compatible servers accept; AWS redirects
        if out.path_style is None:
            out = replace(out, path_style=out.endpoint is not None)
        return out

    def budget(self, client: str = "python") -> str:
        """The time bounds in words, for messages: the Python clients', or s3a's (`client="s3a"`)."""
        if client == "s3a":
            attempt = max(self.request_timeout_s, S3A_FLOOR_S)
            return f"s3a: {self.attempts(attempt)} attempt(s) of {attempt:g} s, Hadoop's floor being {S3A_FLOOR_S:g} s"
        return super().budget(client)

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def describe(self) -> str:
        """Where the store is, for messages (no secrets): the endpoint the clients are given, also when it comes
        from the environment (AWS_ENDPOINT_URL), else AWS S3 and the region they use."""
        o = self.resolved()
        return o.endpoint or f"AWS S3 (region {o.region})"

    # --- one set of options per client ------------------------------------------------------
    def delta_options(self) -> dict[str, str]:
        """`storage_options` for `deltalake` (delta-rs's object_store)."""
        o = self.resolved()  # its region is set (us-east-1 at the least)
        out = {"AWS_REGION": cast(str, o.region), "AWS_EC2_METADATA_DISABLED": "true" if o.endpoint else "false",
               "timeout": _ms(o.request_timeout_s), "connect_timeout": _ms(o.connect_timeout_s),
               "max_retries": str(o.attempts(o.request_timeout_s) - 1),
               # no retry starts once this long has passed since the call began: the last attempt ends
               # within call_timeout_s
               "retry_timeout": _ms(max(o.call_timeout_s - o.request_timeout_s, 0.001))}
        if o.endpoint:
            out["AWS_ENDPOINT_URL"] = o.endpoint
        if o.allow_http:
            out["AWS_ALLOW_HTTP"] = "true"
        if o.path_style:
            out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if o.access_key_id:
            out["AWS_ACCESS_KEY_ID"] = o.access_key_id
        if o.secret_access_key:
            out["AWS_SECRET_ACCESS_KEY"] = o.secret_access_key
        if o.session_token:
            out["AWS_SESSION_TOKEN"] = o.session_token
        if o.profile and not o.access_key_id:
            out["AWS_PROFILE"] = o.profile
        return out

    def arrow_filesystem(self):
        """A pyarrow S3 filesystem on this store (Parquet files, log entries, listings)."""
        import pyarrow.fs as pafs

        o = self.resolved()
        kw: dict[str, Any] = {"region": o.region, "connect_timeout": o.connect_timeout_s,
                              "request_timeout": o.request_timeout_s,
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(
                                  max_attempts=o.attempts(o.request_timeout_s))}
        if o.endpoint:
            scheme, _, host = o.endpoint.partition("://")
            kw.update(endpoint_override=host.rstrip("/"), scheme=scheme)
        if o.access_key_id:
            kw.update(access_key=o.access_key_id, secret_key=o.secret_access_key, session_token=o.session_token)
        elif o.profile:
            kw.update(load_frequency=900)  # the SDK's default chain reads the profile (AWS_PROFILE)
        kw["force_virtual_addressing"] = not o.path_style
        return pafs.S3FileSystem(**kw)

    def client(self):
        """A boto3 S3 client on this store (conditional writes: If-None-Match, If-Match)."""
        import boto3
        from botocore.config import Config

        o = self.resolved()
        session = boto3.session.Session(profile_name=o.profile) if o.profile and not o.access_key_id else boto3
        config = Config(connect_timeout=o.connect_timeout_s, read_timeout=o.request_timeout_s,
                        retries={"total_max_attempts": o.attempts(o.request_timeout_s), "mode": "standard"},
                        s3={"addressing_style": "path" if o.path_style else "auto"},
                        # a run's requests side by side (per-partition writes, a log's commits: 8 each), two steps
                        # of a run at once: more than botocore's 10 pooled connections, which it would discard
                        max_pool_connections=32)
        return session.client("s3", endpoint_url=o.endpoint, region_name=o.region, aws_access_key_id=o.access_key_id,
                              aws_secret_access_key=o.secret_access_key, aws_session_token=o.session_token,
                              config=config)

    def spark_conf(self) -> dict[str, str]:
        """Hadoop s3a settings for Spark (`spark.hadoop.fs.s3a.*`): the same store for the driver,
        a Spark Connect server and a cluster's executors."""
        o = self.resolved()  # its region is set (us-east-1 at the least)
        p = "spark.hadoop.fs.s3a."
        # Hadoop raises every s3a timeout below 15 s to 15 s (MINIMUM_NETWORK_OPERATION_DURATION): the
        # attempts are counted at the timeout s3a really uses. Before these settings an s3a call on a
        # frozen server could take (1 + 3 SDK retries) x (1 + 3 S3A retries) x 30 s, minutes.
        attempt = max(o.request_timeout_s, S3A_FLOOR_S)
        out = {f"{p}path.style.access": str(bool(o.path_style)).lower(), f"{p}endpoint.region": cast(str, o.region),
               f"{p}connection.timeout": _ms(attempt, unit=False),
               f"{p}connection.establish.timeout": _ms(max(o.connect_timeout_s, S3A_FLOOR_S), unit=False),
               f"{p}connection.request.timeout": _ms(attempt, unit=False),
               f"{p}connection.acquisition.timeout": _ms(attempt, unit=False),
               # one layer of retries (S3A's), so the attempts are counted once
               f"{p}attempts.maximum": "0", f"{p}retry.limit": str(o.attempts(attempt) - 1),
               f"{p}retry.interval": "500ms",
               # blocks of an upload buffered in the JVM's heap, not on local disk: no local folder is
               # needed (and Spark's local file system here is the raw one, which s3a's disk buffer
               # cannot use)
               f"{p}fast.upload.buffer": "array"}
        if o.endpoint:
            out[f"{p}endpoint"] = o.endpoint
            out[f"{p}connection.ssl.enabled"] = str(not o.allow_http).lower()
        if o.access_key_id:
            out[f"{p}access.key"] = o.access_key_id
            out[f"{p}secret.key"] = o.secret_access_key or ""
            if o.session_token:
                out[f"{p}session.token"] = o.session_token
                out[f"{p}aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        return out

    def as_env(self) -> dict[str, str]:
        """The options as AWS environment variables, for a process Laminar starts (a Connect server)."""
        o = self.resolved()
        pairs = {"AWS_ENDPOINT_URL": o.endpoint, "AWS_REGION": o.region, "AWS_ACCESS_KEY_ID": o.access_key_id,
                 "AWS_SECRET_ACCESS_KEY": o.secret_access_key, "AWS_SESSION_TOKEN": o.session_token,
                 "AWS_PROFILE": o.profile}
        return {k: v for k, v in pairs.items() if v}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
