"""Shared stage: raw trades deduplicated by trade_id, joined with the symbols dimension."""

from laminar_assets.engine import DimensionJoin, StageSpec

normalized_trades = StageSpec(
    name="normalized_trades",
    description="Trades deduplicated by trade_id within the hour, with sector and currency from `symbols`, "
                "notional (price x quantity) and signed quantity (buys +, sells -).",
    source="raw_trades",
    event_time="event_time",
    partitioning="hourly",
    filter="quantity > 0 AND price > 0",
    derived={
        "notional": "price * quantity",
        "signed_quantity": "CASE WHEN side = 'SELL' THEN -quantity ELSE quantity END",
    },
    dedup_key=("trade_id",),
    joins=(DimensionJoin("symbols", on=("symbol",), columns=("sector", "currency")),),
)
