-- Flows defined in SQL: each CREATE MATERIALIZED VIEW here is an asset like a Python module's spec
-- (compiled by laminar_assets/engine/sql_views.py; `laminar explain <name>` shows the compiled spec).

-- Incremental: COUNT(DISTINCT) keeps the set of accounts, MIN_BY/MAX_BY an (event time, price) pair and
-- how many rows hold it. The set cannot retract, so a delete or an update recomputes the windows it
-- touches (NON_APPEND_ON_NON_RETRACTABLE).
-- Laminar's MIN_BY/MAX_BY break ties by the value (Spark's own pick any of the tied rows).
CREATE MATERIALIZED VIEW symbol_activity_15m
  PARTITIONED BY HOUR
  COMMENT 'Per symbol and 15 minutes: distinct accounts, first and last price (by event time), trades.'
  WITH (owners = 'team:markets-data', tags = 'domain:trades, tier:gold')
AS SELECT symbol, TUMBLE(event_time, INTERVAL '15' MINUTE),
          COUNT(DISTINCT account) AS accounts,
          MIN_BY(price, event_time) AS first_price,
          MAX_BY(price, event_time) AS last_price,
          COUNT(*) AS trades
   FROM normalized_trades
   GROUP BY symbol, TUMBLE(event_time, INTERVAL '15' MINUTE);

-- Refill-only: an exact median has no state that merges, so every run recomputes exactly the windows its
-- changes touch and records QUERY_NOT_INCREMENTALIZABLE: PERCENTILE(price, 0.5).
CREATE MATERIALIZED VIEW sector_median_1h
  PARTITIONED BY HOUR
  COMMENT 'Per sector and hour: exact median trade price and trade count.'
  WITH (owners = 'team:markets-data', tags = 'domain:trades, tier:gold')
AS SELECT sector, TUMBLE(event_time, INTERVAL '1' HOUR),
          PERCENTILE(price, 0.5) AS median_price,
          COUNT(*) AS trades
   FROM normalized_trades
   GROUP BY sector, TUMBLE(event_time, INTERVAL '1' HOUR);
