"""The Spark session of a Dagster run."""


import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from laminar_assets.engine import SparkOptions, build_session

# Sessions a Spark Connect client closed (its server restarted), kept referenced: dropping the last reference runs
# the session's __del__, which closes its gRPC channel and waited there, in the step's thread, for calls to the
# server that is gone. A run's process ends with os._exit (laminar_assets/process_exit.py), which runs no __del__.
_CLOSED_SESSIONS: list[Any] = []


class SparkResource(dg.ConfigurableResource):
    """A SparkSession for the run: `local[*]` by default, a cluster via `master`, or a Spark Connect endpoint
    via `remote` (e.g. `sc://spark-connect:15002`), started on first use.

    Its fields (but `stop_at_end`) are also the dg component's `spark` attributes (`SparkAttributes`, made from
    these fields): a field added here is one there, with this description and default."""

    master: str | None = Field(default=None, description=(
        "A cluster's master URL (spark://host:7077). Unset: LAMINAR_SPARK_MASTER when the run starts, else "
        "local[*] (a local JVM)."))
    remote: str | None = Field(default=None, description=(
        "A Spark Connect endpoint (sc://host:15002): the run's session is a client of that server. Unset: "
        "LAMINAR_SPARK_REMOTE when the run starts, else none."))
    shuffle_partitions: int = Field(default=4, description=(
        "Partitions of a shuffle (spark.sql.shuffle.partitions), also of a Delta snapshot's and a file "
        "listing's jobs."))
    driver_memory: str = Field(default="2g", description=(
        "The driver's memory (spark.driver.memory) of a JVM Laminar starts, e.g. '2g'."))
    conf: dict[str, str] = Field(default={}, description=(
        "Extra Spark configuration, key to value, over Laminar's own (a remote session takes its spark.sql.* "
        "keys only)."))
    jit: str | None = Field(default=None, description=(
        "How a JVM Laminar starts compiles: 'tiered' (the JVM's own), 'hot' (C2 only for the hottest code: for a "
        "long-lived JVM serving batched runs) or 'quick' (C1 only: less CPU for short runs over small data on "
        "few cores, the demo; slower on large scans). Unset: LAMINAR_SPARK_JIT when the run starts, else "
        "'tiered'."))
    metastore: str | None = Field(default=None, description=(
        "The Hive metastore of a JVM Laminar starts: a folder (embedded Derby), a postgresql:// URL (a database "
        "on Postgres, shared by every process) or a jdbc: URL. Unset: LAMINAR_METASTORE when the run starts, "
        "else .laminar/metastore when LAMINAR_CATALOG is set, else none (docs/catalog.md)."))
    stop_at_end: bool = Field(default=True, description=(
        "Stop the session when the run's steps are done (false: a process serving many runs keeps it)."))

    _session: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)  # a run's steps may start in threads at once

    def options(self) -> SparkOptions:
        return SparkOptions.from_env(master=self.master, remote=self.remote, shuffle_partitions=self.shuffle_partitions,
                                     driver_memory=self.driver_memory, conf=dict(self.conf), jit=self.jit,
                                     metastore=self.metastore)

    def get_session(self):
        """The run's session, started on first use, and started again when a Spark Connect client closed it (its
        server restarted under `laminar serve`: the step that lost it fails as retryable, and its retry gets a
        session on the new server)."""
        with self._lock:
            if self._session is not None and getattr(self._session, "is_stopped", False):
                _CLOSED_SESSIONS.append(self._session)
                self._session = None
            if self._session is None:
                self._session = build_session(self.options())
            return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None and self.stop_at_end:
            self._session.stop()
        self._session = None
