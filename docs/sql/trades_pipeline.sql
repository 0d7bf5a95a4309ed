-- The demo's trades pipeline (laminar_assets/flows/*.py) written as materialized views.
-- tests/engine/test_sql_pipeline.py proves both definitions give identical sinks on the same history.
-- To use it instead of the Python modules, put it in laminar_assets/flows/ and remove those modules
-- (a name defined twice fails to load).

CREATE MATERIALIZED VIEW normalized_trades
  PARTITIONED BY HOUR
  COMMENT 'Trades deduplicated by trade_id within the hour, with sector and currency from symbols.'
  WITH (owners = 'team:markets-data', tags = 'domain:trades, tier:silver')
AS SELECT t.*,
          price * quantity AS notional,
          CASE WHEN side = 'SELL' THEN -quantity ELSE quantity END AS signed_quantity,
          s.sector, s.currency
   FROM raw_trades t
   JOIN symbols s USING (symbol)
   QUALIFY ROW_NUMBER() OVER (PARTITION BY trade_id ORDER BY event_time) = 1;

CREATE MATERIALIZED VIEW large_trades
  PARTITIONED BY HOUR
  COMMENT 'Normalized trades with notional above 250,000.'
AS SELECT trade_id, event_time, symbol, account, side, price, quantity, notional, sector
   FROM normalized_trades
   WHERE notional > 250000.0;

CREATE MATERIALIZED VIEW vwap_1m
  PARTITIONED BY HOUR
  COMMENT 'Per symbol and minute: VWAP, volume and trade count.'
AS SELECT symbol, TUMBLE(event_time, INTERVAL '1' MINUTE),
          SUM(notional) AS notional, SUM(quantity) AS volume, COUNT(*) AS trades,
          SUM(notional) / SUM(quantity) AS vwap
   FROM normalized_trades
   GROUP BY symbol, TUMBLE(event_time, INTERVAL '1' MINUTE);

CREATE MATERIALIZED VIEW ohlc_5m
  PARTITIONED BY HOUR
  COMMENT 'Per symbol and 5 minutes: open, high, low, close (by event time) and volume.'
AS SELECT symbol, TUMBLE(event_time, INTERVAL '5' MINUTE),
          FIRST(price) AS open, MAX(price) AS high, MIN(price) AS low, LAST(price) AS close,
          SUM(quantity) AS volume
   FROM normalized_trades
   GROUP BY symbol, TUMBLE(event_time, INTERVAL '5' MINUTE);

CREATE MATERIALIZED VIEW positions_1h
  PARTITIONED BY HOUR
  COMMENT 'Per account and symbol and hour: net signed quantity and gross notional.'
AS SELECT account, symbol, TUMBLE(event_time, INTERVAL '1' HOUR),
          SUM(signed_quantity) AS net_quantity, SUM(notional) AS gross_notional, COUNT(*) AS trades
   FROM normalized_trades
   GROUP BY account, symbol, TUMBLE(event_time, INTERVAL '1' HOUR);

-- Hopping windows follow Flink: HOP(time, slide, size) = 1-hour windows starting every 15 minutes.
CREATE MATERIALIZED VIEW sector_stats_1h
  PARTITIONED BY HOUR
  COMMENT 'Per sector, 1 h windows every 15 min: notional mean and stddev, distinct accounts, p50/p99 quantity.'
AS SELECT sector, HOP(event_time, INTERVAL '15' MINUTE, INTERVAL '1' HOUR),
          AVG(notional) AS avg_notional, STDDEV_SAMP(notional) AS stddev_notional,
          APPROX_COUNT_DISTINCT(account) AS accounts,
          APPROX_PERCENTILE(quantity, 0.5) AS p50_quantity, APPROX_PERCENTILE(quantity, 0.99) AS p99_quantity,
          COUNT(*) AS trades
   FROM normalized_trades
   GROUP BY sector, HOP(event_time, INTERVAL '15' MINUTE, INTERVAL '1' HOUR);
