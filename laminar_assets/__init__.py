"""Laminar: incremental time-window rollups over Delta tables, computed by Spark, orchestrated by Dagster.

`laminar_assets.engine` is the engine (no Dagster); `laminar_assets.flows` holds flow specs;
`laminar_assets.checkpoints` the durable watermarks; `laminar_assets.resources` the Dagster resources.
"""
