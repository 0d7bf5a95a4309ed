"""The Spark session of a Dagster run."""


import threading
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from laminar_assets.engine import SparkOptions, build_session


class SparkResource(dg.ConfigurableResource):
    """A SparkSession for the run: `local[*]` by default, a cluster via `master`,
    or a Spark Connect endpoint via `remote` (e.g. `sc://spark-connect:15002`).
    `jit`: how a JVM Laminar starts compiles: "tiered" (default, the JVM's own), "hot" (C2 only for
    the hottest code: for a long-lived JVM serving batched runs) or "quick" (C1 only: less CPU for
    short runs over small data on few cores, the demo; slower on large scans). Unset fields fall back to `LAMINAR_SPARK_MASTER` /
    `LAMINAR_SPARK_REMOTE` / `LAMINAR_SPARK_JIT`, read when the run starts."""

    master: str | None = None
    remote: str | None = None
    shuffle_partitions: int = 4
    driver_memory: str = "2g"
    conf: dict[str, str] = {}
    jit: str | None = None
    # The Hive metastore of a JVM this resource starts (`SparkOptions.metastore`: a folder for embedded Derby,
    # a postgresql:// URL for a database on Postgres, or a jdbc: URL); unset: LAMINAR_METASTORE, or
    # `.laminar/metastore` when LAMINAR_CATALOG is set.
    metastore: str | None = None
    stop_at_end: bool = True

    _session: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)  # a run's steps may start in threads at once

    def options(self) -> SparkOptions:
        return SparkOptions.from_env(master=self.master, remote=self.remote, shuffle_partitions=self.shuffle_partitions,
                                     driver_memory=self.driver_memory, conf=dict(self.conf), jit=self.jit,
                                     metastore=self.metastore)

    def get_session(self):
        """The run's session, started on first use."""
        with self._lock:
            if self._session is None:
                self._session = build_session(self.options())
            return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None and self.stop_at_end:
            self._session.stop()
        self._session = None
