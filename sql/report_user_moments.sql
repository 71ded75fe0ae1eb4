-- Per-user moments of clicks and impressions per arm, for the user-clustered (delta-method) z-test of
-- the A/B report (abpo/abtest/stats.py: UserMoments, delta_method_ctr_variance).
-- Read from user_month_stats (one row per month, arm and user, maintained at ingest from the clean
-- impressions; sql/user_month_stats_insert.sql), never from the raw log: the cost follows the number of
-- user-months of the selected months, not of impressions.
-- One row per (period, arm): period is a month 'YYYY-MM' (users = distinct users of that month) or
-- 'all' (the selected months together; a user's clicks and impressions summed over them first).
-- For users u with X_u clicks and Y_u impressions: users = n, clicks = sum X_u, impressions = sum Y_u,
-- clicks_sq = sum X_u^2, impressions_sq = sum Y_u^2, clicks_x_impressions = sum X_u Y_u,
-- top_user_impressions = max Y_u (the report flags an arm one user dominates: report.max_user_share).
-- Parameters: $months  list of 'YYYY-MM'.
-- (Each part reads user_month_stats by itself rather than through a shared CTE, so nothing of the size of
-- the aggregate is materialised in between.)
SELECT month AS period, arm,
       count(*)::BIGINT                        AS users,
       sum(clicks)::BIGINT                     AS clicks,
       sum(impressions)::BIGINT                AS impressions,
       sum(clicks * clicks)::BIGINT            AS clicks_sq,
       sum(impressions * impressions)::BIGINT  AS impressions_sq,
       sum(clicks * impressions)::BIGINT       AS clicks_x_impressions,
       max(impressions)::BIGINT                AS top_user_impressions
FROM user_month_stats
WHERE list_contains($months::VARCHAR[], month)
GROUP BY month, arm
UNION ALL
SELECT 'all' AS period, arm,
       count(*)::BIGINT, sum(x)::BIGINT, sum(y)::BIGINT,
       sum(x * x)::BIGINT, sum(y * y)::BIGINT, sum(x * y)::BIGINT, max(y)::BIGINT
FROM (
    SELECT arm, user_id, sum(clicks)::BIGINT AS x, sum(impressions)::BIGINT AS y
    FROM user_month_stats
    WHERE list_contains($months::VARCHAR[], month)
    GROUP BY arm, user_id
) AS per_user_period
GROUP BY arm
ORDER BY period, arm
