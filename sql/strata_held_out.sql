-- The rows of the given months ($months) that the strata leave out because their user is in strata_excluded_users
-- (registered by the caller: the gate's held-out users), per arm: what an update logs as held out.
SELECT
    arm,
    count(*) FILTER (WHERE clicked = 1) AS positive,
    count(*) FILTER (WHERE clicked = 0) AS no_response,
    count(DISTINCT user_id) AS users
FROM impressions
SEMI JOIN strata_excluded_users USING (user_id)
WHERE list_contains($months::VARCHAR[], month)
GROUP BY arm
ORDER BY arm;
