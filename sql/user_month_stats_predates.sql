-- True when the warehouse holds impressions but no month of the per-user aggregate was ever built: a
-- warehouse from before user_month_stats existed (or whose first build never committed). Every month
-- of it is then built on open (sql/impression_months.sql lists them).
SELECT NOT EXISTS (SELECT 1 FROM user_month_stats_built)
       AND EXISTS (SELECT 1 FROM impressions) AS predates;
