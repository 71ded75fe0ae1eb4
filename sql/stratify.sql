-- One stratum of the given months ($months, YYYY-MM list): B_1, the clicked impressions ($clicked = 1), or B_0, the
-- no-response impressions ($clicked = 0) (ABPO_SPEC.md step 3; the rows of the views impressions_positive /
-- impressions_no_response of schema.sql), in a stable order, with the columns an update step needs (timestamps and
-- provenance stay in `impressions`; join on impression_id).
-- The users of strata_excluded_users (an Arrow table the caller registers, Warehouse.strata: the gate's held-out
-- users with arms.gate_users = warehouse, else empty) are left out.
SELECT
    month, impression_id, request_id, user_id, arm, model_version, logging_policy,
    history, candidates, item_id, propensity, clicked
FROM impressions
ANTI JOIN strata_excluded_users USING (user_id)
WHERE clicked = $clicked AND list_contains($months::VARCHAR[], month)
ORDER BY month, impression_id;
