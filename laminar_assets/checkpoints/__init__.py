"""Durable watermarks: what each (flow, partition) has reflected in state and sink."""

from .store import CheckpointStore
from .watermark import FailedRuns, PendingRun, Watermark

__all__ = ["CheckpointStore", "FailedRuns", "PendingRun", "Watermark"]
