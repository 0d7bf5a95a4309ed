"""The Laminar engine as a Dagster resource: where the tables live, and the Spark to use."""


import os
from typing import Any, TypedDict

import dagster as dg
from pydantic import Field

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import CatalogOptions, Connection, Engine, EngineOptions, Exporter
from laminar_assets.engine.export import ENV_OPTIONS, env_name
from laminar_assets.storage import AzureOptions, AzureStore, ObjectStoreOptions
from laminar_assets.storage.gcs import GcsOptions

from .spark import SparkResource


class _CallBounds(TypedDict, total=False):
    """The `TimeBounds` fields a resource sets on its store's options: those it leaves unset keep their defaults."""

    request_timeout_s: float
    call_timeout_s: float


class LaminarResource(dg.ConfigurableResource):
    """Storage root of the Delta tables (sources, stages, sinks, and Laminar's state and watermarks).

    `root` is a local path (relative paths are taken from the working directory) or an object-store
    URI (`s3://bucket/prefix`, reached with the `s3_*` fields, else the AWS environment; `gs://bucket/prefix`,
    reached with the `gcs_*` fields, else the Google environment). When it is
    not configured, `LAMINAR_ROOT` (read when a run or sensor starts) or `.laminar/lake`.

    `connections`: the exports' targets, name -> URL (`{"analytics": dg.EnvVar("ANALYTICS_PG_URL")}`: an
    `EnvVar` keeps the URL, and a password in it, out of the definitions). A connection not named here comes
    from `LAMINAR_CONNECTION_<NAME>_URL`; `LAMINAR_CONNECTION_<NAME>_PASSWORD` gives a password kept out of
    the URL either way. Read when a delivery starts; never logged.
    """

    root: str | None = None
    spark: SparkResource
    lease_seconds: float = 6 * 3600
    # An S3 or S3-compatible store (a root s3://bucket/prefix); the time bounds apply to a gs:// or Azure root
    # too. The `s3_*` fields are also the dg component's `s3` attributes, without the prefix (`S3Attributes`, made
    # from these fields): a field added here is one there, with this description and default.
    s3_endpoint: str | None = Field(default=None, description=(
        "The store's URL, e.g. http://127.0.0.1:9000 for a local or S3-compatible one. Unset: AWS_ENDPOINT_URL_S3 "
        "or AWS_ENDPOINT_URL, else AWS S3."))
    s3_region: str | None = Field(default=None, description=(
        "The store's region. Unset: AWS_REGION or AWS_DEFAULT_REGION, else us-east-1."))
    s3_access_key_id: str | None = Field(default=None, description=(
        "The access key's id. Unset: AWS_ACCESS_KEY_ID, else the AWS SDKs' chain (a profile, an instance role)."))
    s3_secret_access_key: str | None = Field(default=None, description=(
        "The access key's secret (never logged). Unset: AWS_SECRET_ACCESS_KEY, else the AWS SDKs' chain."))
    s3_path_style: bool | None = Field(default=None, description=(
        "Path-style addressing (http://host/bucket/key), what S3-compatible servers need. Unset: on exactly "
        "when an endpoint is set."))
    s3_request_timeout_s: float | None = Field(default=None, description=(
        "Seconds one attempt of a call on the store may go without an answer before it is abandoned. Unset: "
        f"{ObjectStoreOptions.request_timeout_s:g}."))
    s3_call_timeout_s: float | None = Field(default=None, description=(
        "Seconds one call on the store may take in all, its attempts included, before it fails (and so the run). "
        f"Unset: {ObjectStoreOptions.call_timeout_s:g}."))
    # A Google Cloud Storage bucket (a root gs://bucket/prefix): an endpoint (an emulator; else
    # STORAGE_EMULATOR_HOST, else GCS itself), a JSON key file's path (else GOOGLE_APPLICATION_CREDENTIALS,
    # else Google's default chain) and a project. The s3_*_timeout_s bounds apply to it too.
    gcs_endpoint: str | None = None
    gcs_credentials: str | None = None
    gcs_project: str | None = None
    # An Azure root (abfss://container@account.dfs.core.windows.net/prefix): the account's key or a SAS
    # token, and an endpoint for an emulator or a private endpoint (unset: AZURE_STORAGE_ACCOUNT_KEY,
    # AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_ENDPOINT). The s3_*_timeout_s bounds apply to it too.
    azure_endpoint: str | None = None
    azure_account_key: str | None = None
    azure_sas_token: str | None = None
    connections: dict[str, str] = {}
    # Any `EngineOptions` field by name ({"refill_ratio": 0.3, "key_refill_min_bytes": 1048576}): over the
    # project's [tool.laminar.engine] and its defaults (docs/dagster.md, "Engine options").
    engine_options: dict[str, Any] = {}
    # The catalog schema every table a run writes is registered in (the Hive metastore of the run's Spark:
    # SparkResource.metastore, or the Connect server's), and where sources named `schema.table` are found.
    # None: LAMINAR_CATALOG when set, else no catalog (docs/catalog.md).
    catalog_schema: str | None = None

    def resolved_root(self) -> str:
        """The root, with this resource's store mounted at it (`storage.mount`): every file under it (read by
        an engine, a sensor, a check or an export) is reached with these options in this process, whatever
        other roots use."""
        root = storage.resolve_root(self.root or os.environ.get("LAMINAR_ROOT") or ".laminar/lake")
        storage.mount(root, self.store(root))
        return root

    def store(self, root: str | None = None) -> ObjectStoreOptions | GcsOptions | AzureOptions:
        """How this resource reaches its root's object store (`root`: the resolved root; unset fields: the AWS
        environment, or for a gs:// root the Google one, for an Azure root the Azure one)."""
        bounds: _CallBounds = {}
        if self.s3_request_timeout_s is not None:
            bounds["request_timeout_s"] = self.s3_request_timeout_s
        if self.s3_call_timeout_s is not None:
            bounds["call_timeout_s"] = self.s3_call_timeout_s
        root = root or self.root or ""
        if root.startswith("gs://"):
            return GcsOptions(endpoint=self.gcs_endpoint, credentials=self.gcs_credentials, project=self.gcs_project,
                              **bounds)
        if "://" in root and root.split("://", 1)[0].lower() in AzureStore.schemes:
            return AzureOptions(endpoint=self.azure_endpoint, account_key=self.azure_account_key,
                                sas_token=self.azure_sas_token, **bounds)
        return ObjectStoreOptions(endpoint=self.s3_endpoint, region=self.s3_region, access_key_id=self.s3_access_key_id,
                                  secret_access_key=self.s3_secret_access_key, path_style=self.s3_path_style,
                                  **bounds)

    def engine(self, **options) -> Engine:
        """An engine on this run's Spark session (the root's store is mounted before the session starts, so
        a session started now knows its bucket). `options`: `EngineOptions` the project's settings decide
        (`LaminarSettings.engine_options()`); this resource's `lease_seconds` and `engine_options` override them."""
        chosen = EngineOptions.of({**options, "lease_seconds": self.lease_seconds, **self.engine_options},
                                  where="LaminarResource.engine_options")
        root = self.resolved_root()
        schema = self.catalog_schema or os.environ.get("LAMINAR_CATALOG") or None
        return Engine(self.spark.get_session(), root, connections=self.resolved_connections(),
                      options=chosen,
                      catalog=CatalogOptions(schema=schema) if schema else None)

    def resolved_connections(self) -> dict[str, Connection]:
        """The connections named in `connections`, with the options the environment gives them (a password)."""
        return {name: Connection(name, url, {o: os.environ[env_name(name, o)] for o in ENV_OPTIONS
                                             if os.environ.get(env_name(name, o))})
                for name, url in self.connections.items()}

    def exporter(self) -> Exporter:
        """Deliveries of exports under this root, without Spark (an export's asset starts no session)."""
        return Exporter(self.resolved_root(), connections=self.resolved_connections())

    def checkpoints(self) -> CheckpointStore:
        """Watermarks, readable without Spark (sensors and checks use this)."""
        return CheckpointStore(self.resolved_root(), lease_seconds=self.lease_seconds)
