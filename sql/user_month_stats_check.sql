-- The per-user aggregate against the raw clean impressions, per month and arm: the rows where they
-- differ (users, impressions or clicks). Empty when user_month_stats is current. A full scan of the
-- months' impressions: run by `abpo data rebuild-aggregates --check`, never by the report.
-- $months: YYYY-MM list, or NULL for every month of either table.
WITH raw AS (
    SELECT month, arm, count(DISTINCT user_id) AS users, count(*)::BIGINT AS impressions,
           sum(clicked)::BIGINT AS clicks
    FROM impressions
    WHERE $months::VARCHAR[] IS NULL OR list_contains($months::VARCHAR[], month)
    GROUP BY month, arm
),
agg AS (
    SELECT month, arm, count(*) AS users, sum(impressions)::BIGINT AS impressions, sum(clicks)::BIGINT AS clicks
    FROM user_month_stats
    WHERE $months::VARCHAR[] IS NULL OR list_contains($months::VARCHAR[], month)
    GROUP BY month, arm
)
SELECT coalesce(r.month, a.month) AS month, coalesce(r.arm, a.arm) AS arm,
       r.users AS raw_users, a.users AS aggregate_users,
       r.impressions AS raw_impressions, a.impressions AS aggregate_impressions,
       r.clicks AS raw_clicks, a.clicks AS aggregate_clicks
FROM raw AS r
FULL OUTER JOIN agg AS a ON r.month = a.month AND r.arm = a.arm
WHERE r.users IS DISTINCT FROM a.users OR r.impressions IS DISTINCT FROM a.impressions
   OR r.clicks IS DISTINCT FROM a.clicks
ORDER BY 1, 2;
