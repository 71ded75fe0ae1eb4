-- Record that user_month_stats holds $month as of the month's current number of ingest runs (run after
-- ingest_log_run.sql in the ingest transaction), with its totals; returns users, impressions, clicks.
INSERT OR REPLACE INTO user_month_stats_built
SELECT
    $month,
    (SELECT count(*) FROM ingest_runs WHERE month = $month),
    count(*),
    coalesce(sum(impressions), 0)::BIGINT,
    coalesce(sum(clicks), 0)::BIGINT,
    now()
FROM user_month_stats
WHERE month = $month
RETURNING users, impressions, clicks;
