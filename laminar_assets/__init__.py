"""Laminar: incremental time-window rollups over Delta tables, computed by Spark, orchestrated by Dagster.

`laminar_assets.engine` is the engine (no Dagster); `laminar_assets.flows` holds flow specs;
`laminar_assets.checkpoints` the durable watermarks; `laminar_assets.resources` the Dagster resources.
"""

__all__ = ["LaminarComponent", "build_definitions"]


def __getattr__(name: str):
    # Lazy: `dg` imports this package to find its components, and the CLI should not pay for Dagster.
    if name == "LaminarComponent":
        from laminar_assets.orchestration.component import LaminarComponent

        return LaminarComponent
    if name == "build_definitions":
        from laminar_assets.orchestration.builder import build_definitions

        return build_definitions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

