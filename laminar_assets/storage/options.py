"""How to reach an object store: endpoint, region, credentials, addressing and time bounds.

One `ObjectStoreOptions` feeds every client Laminar uses on a bucket, so they all reach the same
store the same way: `deltalake` (storage options), pyarrow's S3 filesystem (Parquet files, the
Delta log), boto3 (conditional writes of watermarks and leases) and Spark's s3a (Hadoop settings).

Unset fields fall back to the usual places when a client is made, never at import time: the AWS
environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`), then the SDKs' own chain (profiles,
instance roles). Secrets never appear in `repr`, logs or error messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

_ENV = {  # field -> environment variables, first set wins
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "profile": ("AWS_PROFILE",),
}


@dataclass(frozen=True)
class ObjectStoreOptions:
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
    # Bounds that make an unreachable store fail within seconds instead of minutes of retries.
    connect_timeout_s: float = 3.0
    request_timeout_s: float = 30.0
    max_attempts: int = 3

    def resolved(self) -> ObjectStoreOptions:
        """These options with unset fields taken from the environment (read now, not at import)."""
        found: dict[str, Any] = {}
        for name, variables in _ENV.items():
            if getattr(self, name) is None:
                value = next((os.environ[v] for v in variables if os.environ.get(v)), None)
                if value is not None:
                    found[name] = value
        out = replace(self, **found)
        if out.region is None:
            out = replace(out, region="us-east-1")  # what S3-compatible servers accept; AWS redirects
        if out.path_style is None:
            out = replace(out, path_style=out.endpoint is not None)
        return out

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
        o = self.resolved()
        out = {"AWS_REGION": o.region, "AWS_EC2_METADATA_DISABLED": "true" if o.endpoint else "false",
               "timeout": f"{int(o.request_timeout_s)}s", "connect_timeout": f"{int(o.connect_timeout_s)}s",
               "max_retries": str(max(o.max_attempts - 1, 0)), "retry_timeout": f"{int(o.request_timeout_s)}s"}
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
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=o.max_attempts)}
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
                        retries={"max_attempts": o.max_attempts, "mode": "standard"},
                        s3={"addressing_style": "path" if o.path_style else "auto"})
        return session.client("s3", endpoint_url=o.endpoint, region_name=o.region, aws_access_key_id=o.access_key_id,
                              aws_secret_access_key=o.secret_access_key, aws_session_token=o.session_token,
                              config=config)

    def spark_conf(self) -> dict[str, str]:
        """Hadoop s3a settings for Spark (`spark.hadoop.fs.s3a.*`): the same store for the driver,
        a Spark Connect server and a cluster's executors."""
        o = self.resolved()
        p = "spark.hadoop.fs.s3a."
        out = {f"{p}path.style.access": str(bool(o.path_style)).lower(), f"{p}endpoint.region": o.region,
               f"{p}connection.timeout": str(int(o.request_timeout_s * 1000)),
               f"{p}connection.establish.timeout": str(int(o.connect_timeout_s * 1000)),
               f"{p}attempts.maximum": str(o.max_attempts), f"{p}retry.limit": str(o.max_attempts),
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
