"""Dagster resources: Spark, and the Laminar engine bound to a storage root."""

from .laminar import LaminarResource
from .spark import SparkResource

__all__ = ["LaminarResource", "SparkResource"]
