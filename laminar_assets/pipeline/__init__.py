"""The pipeline as plain data, without Dagster: the spec graph, a sensor tick's dirty partitions, the project's settings."""
