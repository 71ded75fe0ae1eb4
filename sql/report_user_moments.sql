-- Per-user moments of clicks and impressions per arm, for the user-clustered (delta-method) z-test of
-- the A/B report (abpo/abtest/stats.py: UserMoments, delta_method_ctr_variance).
-- One row per (period, arm): period is a month 'YYYY-MM' (users = distinct users of that month) or
-- 'all' (the selected months together; a user's clicks and impressions summed over them).
-- For users u with X_u clicks and Y_u impressions: users = n, clicks = sum X_u, impressions = sum Y_u,
-- clicks_sq = sum X_u^2, impressions_sq = sum Y_u^2, clicks_x_impressions = sum X_u Y_u.
-- Parameters: $months  list of 'YYYY-MM'.
WITH per_user_month AS (
    SELECT month, arm, user_id,
           sum(clicked)::BIGINT AS x,
           count(*)::BIGINT     AS y
    FROM impressions
    WHERE list_contains($months::VARCHAR[], month)
    GROUP BY month, arm, user_id
),
per_user_period AS (
    SELECT arm, user_id, sum(x)::BIGINT AS x, sum(y)::BIGINT AS y
    FROM per_user_month
    GROUP BY arm, user_id
)
SELECT month AS period, arm,
       count(*)::BIGINT    AS users,
       sum(x)::BIGINT      AS clicks,
       sum(y)::BIGINT      AS impressions,
       sum(x * x)::BIGINT  AS clicks_sq,
       sum(y * y)::BIGINT  AS impressions_sq,
       sum(x * y)::BIGINT  AS clicks_x_impressions
FROM per_user_month
GROUP BY month, arm
UNION ALL
SELECT 'all' AS period, arm,
       count(*)::BIGINT, sum(x)::BIGINT, sum(y)::BIGINT,
       sum(x * x)::BIGINT, sum(y * y)::BIGINT, sum(x * y)::BIGINT
FROM per_user_period
GROUP BY arm
ORDER BY period, arm
