-- B_0: no-response impressions of the given months ($months, YYYY-MM list), in a stable order, with the
-- columns an update step needs (timestamps and provenance stay in `impressions`; join on impression_id).
SELECT
    month, impression_id, request_id, user_id, arm, model_version, logging_policy,
    history, candidates, item_id, propensity, clicked
FROM impressions_no_response
WHERE list_contains($months::VARCHAR[], month)
ORDER BY month, impression_id;
