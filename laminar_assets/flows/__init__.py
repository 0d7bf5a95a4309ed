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


def load_specs(contracts_dir=None):
    """Every spec defined in this package, stages before the flows that read them, with the
    quarantine rules of their sources' contracts (`contracts_dir`, default `data_contracts/`)."""
    from laminar_assets.contracts import CONTRACTS, load_contracts, with_contract_rules
    from laminar_assets.engine import collect_specs

    contracts = load_contracts(contracts_dir or CONTRACTS)
    return [with_contract_rules(s, contracts) for s in collect_specs(__name__)]


def load_exports():
    """Every export defined in this package (PostgresExport, ..., CREATE SINK), each after the spec it reads."""
    from laminar_assets.engine import collect

    return collect(__name__).exports
