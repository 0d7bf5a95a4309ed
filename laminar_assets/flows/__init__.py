"""Flow and stage specs, one module each. Adding a module here adds an asset.

The trades pipeline (the demo):

    raw_trades ─┐
                ├─> normalized_trades ─┬─> vwap_1m
    symbols ────┘   (dedup, join)      ├─> ohlc_5m
                                       ├─> sector_stats_1h  (hopping 1 h / 15 min)
                                       ├─> positions_1h
                                       └─> large_trades     (row-level stage)
"""

from __future__ import annotations


def load_specs():
    """Every spec defined in this package, stages before the flows that read them."""
    from laminar_assets.engine.registry import collect_specs

    return collect_specs(__name__)
