"""Where tables live under a storage root, and the Delta app-transaction ids of partitions.

    <root>/<table>                                    sources, stage outputs and sinks (or absolute URIs)
    <root>/_laminar/state/<flow>/<spec hash>-<schema>  state of one spec over one input schema
    <root>/_laminar/quarantine/<source>                rows that broke a rule
    <root>/_laminar/checkpoints, locks, sweeps          see checkpoints/store.py
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from .tables import resolve_uri


@dataclass(frozen=True)
class Layout:
    """Paths and Delta app-transaction ids under one storage root."""

    root: str

    def table_uri(self, name: str) -> str:
        return resolve_uri(self.root, name)

    def sink_uri(self, spec) -> str:
        return self.table_uri(spec.sink)

    def state_uri(self, spec, input_schema: dict[str, str]) -> str:
        """State of one spec over one input schema: a compatible type change (SCHEMA_CHANGED) refills
        into a fresh table instead of clashing with the old state's column types."""
        schema = hashlib.sha256(json.dumps(sorted(input_schema.items())).encode()).hexdigest()[:8]
        return f"{self.root}/_laminar/state/{spec.name}/{spec.spec_hash}-{schema}"

    def quarantine_uri(self, source: str) -> str:
        return f"{self.root}/_laminar/quarantine/{os.path.basename(source.rstrip('/'))}"

    def guard_uri(self, spec, input_schema: dict[str, str]) -> str:
        """The table whose app transaction says whether a run's first commit landed."""
        return self.state_uri(spec, input_schema) if spec.kind == "flow" else self.sink_uri(spec)

    @staticmethod
    def app_id(spec, partition: str) -> str:
        return f"laminar/{spec.name}/{partition}"
