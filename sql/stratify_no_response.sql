-- B_0: no-response impressions of the given months ($months, YYYY-MM list), in a stable order, with the
-- columns an update step needs (timestamps and provenance stay in `impressions`; join on impression_id).
-- The users of strata_excluded_users (registered by the caller, as in stratify_positive.sql) are left out.
SELECT
    month, impression_id, request_id, user_id, arm, model_version, logging_policy,
    history, candidates, item_id, propensity, clicked
FROM impressions_no_response
ANTI JOIN strata_excluded_users USING (user_id)
WHERE list_contains($months::VARCHAR[], month)
ORDER BY month, impression_id;
