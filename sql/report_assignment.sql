-- The A/B report's assignment check (abpo/abtest/analysis.py): is every logged user in the arm the experiment's
-- salted hash assigns them (abpo/abtest/assignment.py: u = first 64 bits of sha256('<salt>:<user id>') / 2^64,
-- the arm whose interval of the cumulative shares holds u)? Computed here on the per-user aggregate
-- user_month_stats, so it costs one hash per distinct user of the selected months, not one per impression;
-- tests/abtest/test_assignment_check.py holds this hash equal to the Python one.
-- One row per (period, arm) as in sql/report_user_moments.sql: users, misassigned_users (users whose rows are
-- in an arm the hash does not give them), misassigned_impressions (their impressions in this arm) and
-- example_user (the smallest such user id, to name one).
-- Parameters: $months list of 'YYYY-MM'; $salt the series' salt; $arms the served arms in assignment order
-- (arms.names); $bounds their cumulative shares (abpo.abtest.assignment.cumulative_bounds).
WITH users_seen AS (
    SELECT month, arm, user_id, impressions
    FROM user_month_stats
    WHERE list_contains($months::VARCHAR[], month)
), hashed AS (
    SELECT user_id,
           ('0x' || left(sha256($salt::VARCHAR || ':' || user_id::VARCHAR), 16))::UBIGINT::DOUBLE
               / 18446744073709551616.0 AS u
    FROM (SELECT DISTINCT user_id FROM users_seen) AS distinct_users
), assigned AS (
    SELECT user_id,
           ($arms::VARCHAR[])[least(1 + len(list_filter($bounds::DOUBLE[], lambda b: b <= u)),
                                    len($arms::VARCHAR[]))] AS assigned_arm
    FROM hashed
), rows_checked AS (
    SELECT s.month, s.arm, s.user_id, s.impressions, s.arm IS DISTINCT FROM a.assigned_arm AS wrong
    FROM users_seen AS s JOIN assigned AS a USING (user_id)
)
SELECT month AS period, arm,
       count(*)::BIGINT                                         AS users,
       count(*) FILTER (WHERE wrong)::BIGINT                    AS misassigned_users,
       coalesce(sum(impressions) FILTER (WHERE wrong), 0)::BIGINT AS misassigned_impressions,
       min(user_id) FILTER (WHERE wrong)                        AS example_user
FROM rows_checked
GROUP BY month, arm
UNION ALL
SELECT 'all' AS period, arm,
       count(DISTINCT user_id)::BIGINT,
       count(DISTINCT user_id) FILTER (WHERE wrong)::BIGINT,
       coalesce(sum(impressions) FILTER (WHERE wrong), 0)::BIGINT,
       min(user_id) FILTER (WHERE wrong)
FROM rows_checked
GROUP BY arm
ORDER BY period, arm
