"""The Laminar engine as a Dagster resource: where the tables live, and the Spark to use."""


import os

import dagster as dg

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Engine, EngineOptions

from .spark import SparkResource


class LaminarResource(dg.ConfigurableResource):
    """Storage root of the Delta tables (sources, stages, sinks, and Laminar's state and watermarks).

    `root` is a local path (relative paths are taken from the working directory). When it
    is not configured, `LAMINAR_ROOT` (read when a run or sensor starts) or `.laminar/lake`.
    """

    root: str | None = None
    spark: SparkResource
    lease_seconds: float = 6 * 3600

    def resolved_root(self) -> str:
        return os.path.abspath(self.root or os.environ.get("LAMINAR_ROOT") or ".laminar/lake")

    def engine(self) -> Engine:
        """An engine on this run's Spark session."""
        return Engine(self.spark.get_session(), self.resolved_root(), options=EngineOptions(lease_seconds=self.lease_seconds))

    def checkpoints(self) -> CheckpointStore:
        """Watermarks, readable without Spark (sensors and checks use this)."""
        return CheckpointStore(self.resolved_root(), lease_seconds=self.lease_seconds)
