-- $month's clean impressions summed per (arm, user): impressions = rows, clicks = sum of clicked.
-- Read from the month's clean partition as it stands in the same transaction (just re-inserted by
-- ingest_insert_clean.sql, or as held when rebuilding), so quarantined rows never count.
INSERT INTO user_month_stats
SELECT
    $month                  AS month,
    arm,
    user_id,
    count(*)::BIGINT        AS impressions,
    sum(clicked)::BIGINT    AS clicks
FROM impressions
WHERE month = $month
GROUP BY arm, user_id;
