"""The Dagster layer: assets, sensors, schedules and checks built from specs, over the engine's public API."""
