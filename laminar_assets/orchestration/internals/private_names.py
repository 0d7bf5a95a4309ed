"""Names Laminar takes from Dagster's private modules (`dagster._...`), in one place.

Each is a data type or constant that Dagster's public API hands out or reads but does not export: the
status of an asset check's last execution (sensors hold partitions behind a failed blocking check), the
materialization a check evaluation targets (checks evaluated per partition of a range run), the standard
table metadata keys, the run tag that carries a data version, and the type of the job `define_asset_job`
returns (a schedule's job, for the type checker). A Dagster upgrade that moves one of
them breaks this module's import, not code spread over the orchestration package;
`tests/test_boundaries.py` keeps every other module off `dagster._`.
"""

from __future__ import annotations

from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.definitions.metadata import TableMetadataSet
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

__all__ = [
    "DATA_VERSION_TAG",
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "TableMetadataSet",
    "UnresolvedAssetJobDefinition",
]
