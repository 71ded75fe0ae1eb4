-- CTR per arm and month from the clean impressions: impressions, clicks, distinct users, ctr.
-- $months: YYYY-MM list, or NULL for every ingested month.
SELECT
    month,
    arm,
    count(*)                 AS impressions,
    sum(clicked)::BIGINT     AS clicks,
    count(DISTINCT user_id)  AS users,
    sum(clicked) / count(*)  AS ctr
FROM impressions
WHERE $months::VARCHAR[] IS NULL OR list_contains($months::VARCHAR[], month)
GROUP BY month, arm
ORDER BY month, arm;
