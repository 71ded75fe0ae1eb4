-- P (positive rows, B_1) and N (no-response rows, B_0) of the given months ($months, YYYY-MM list), without the
-- users of strata_excluded_users (registered by the caller, as in stratify.sql).
SELECT
    count(*) FILTER (WHERE clicked = 1) AS positive,
    count(*) FILTER (WHERE clicked = 0) AS no_response
FROM impressions
ANTI JOIN strata_excluded_users USING (user_id)
WHERE list_contains($months::VARCHAR[], month);
