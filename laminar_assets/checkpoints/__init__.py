"""Durable watermarks: what each (flow, partition) has reflected in state and sink."""

from .store import CheckpointStore
from .watermark import FailedRuns, Holder, PendingRun, Watermark

__all__ = ["CheckpointStore", "FailedRuns", "Holder", "PendingRun", "Watermark"]
