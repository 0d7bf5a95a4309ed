"""Shared stage: raw trades deduplicated by trade_id, joined with the symbols dimension.

Rows breaking raw_trades' contract rules (data_contracts/raw_trades.yaml, `quarantine`) and
trades of unknown symbols go to the quarantine table `_laminar/quarantine/raw_trades`."""

from laminar_assets.engine import DimensionJoin, StageSpec

normalized_trades = StageSpec(
    name="normalized_trades",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "silver"},
    description="Trades deduplicated by trade_id within the hour, with sector and currency from `symbols`, "
                "notional (price x quantity) and signed quantity (buys +, sells -).",
    source="raw_trades",
    event_time="event_time",
    partitioning="hourly",
    derived={
        "notional": "price * quantity",
        "signed_quantity": "CASE WHEN side = 'SELL' THEN -quantity ELSE quantity END",
    },
    dedup_key=("trade_id",),
    joins=(DimensionJoin("symbols", on=("symbol",), columns=("sector", "currency")),),
)
