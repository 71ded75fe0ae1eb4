-- Drop $month's rows of the per-user aggregate (inside the ingest or rebuild transaction, before their
-- replacement by user_month_stats_insert.sql).
DELETE FROM user_month_stats WHERE month = $month;
