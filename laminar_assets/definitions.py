"""This repository's Dagster `Definitions`, built from the specs in `laminar_assets/flows/` and the
settings in pyproject.toml by the same builder `LaminarComponent` uses (`orchestration/builder.py`).

Loaded by `workspace.yaml`, `dagster dev` and `dagster asset materialize` (via
`[tool.dagster]` in pyproject.toml). Adding a flow module adds an asset.
"""

from __future__ import annotations

from laminar_assets.flows import load_exports, load_specs
from laminar_assets.orchestration.builder import (  # noqa: F401  (the builder's API, re-exported)
    CONTRACTS,
    build_definitions,
    specs_with_contracts,
)
from laminar_assets.pipeline.settings import load_settings

defs = build_definitions(load_specs(), load_settings(), exports=load_exports())
