-- The stratified mini-batches of the given months ($months), streamed in (batch, slot) order. Each stratum's rows
-- are numbered (rank) in the stable order of stratify.sql (month, impression_id) on the keys alone; the batch plan
-- the caller registered (batch_plan_positive, batch_plan_no_response: rank, batch, slot;
-- abpo.data.batching.stratified_batch_plan) maps ranks to slots, so a row the
-- plan recycles appears once per slot it fills; only then are the rows' columns fetched (by rowid) and sorted into
-- batch order. DuckDB sorts and spills; the caller reads the result a chunk at a time. The users of
-- strata_excluded_users (registered by the caller, as in stratify.sql) are left out before the ranks.
WITH positive_keys AS (
    SELECT rowid AS row_key, row_number() OVER (ORDER BY month, impression_id) - 1 AS rank
    FROM impressions
    ANTI JOIN strata_excluded_users USING (user_id)
    WHERE clicked = 1 AND list_contains($months::VARCHAR[], month)
),
no_response_keys AS (
    SELECT rowid AS row_key, row_number() OVER (ORDER BY month, impression_id) - 1 AS rank
    FROM impressions
    ANTI JOIN strata_excluded_users USING (user_id)
    WHERE clicked = 0 AND list_contains($months::VARCHAR[], month)
),
slots AS (
    SELECT k.row_key, p.batch, p.slot FROM batch_plan_positive AS p JOIN positive_keys AS k ON p.rank = k.rank
    UNION ALL
    SELECT k.row_key, p.batch, p.slot FROM batch_plan_no_response AS p JOIN no_response_keys AS k ON p.rank = k.rank
)
SELECT
    i.month, i.impression_id, i.request_id, i.user_id, i.arm, i.model_version, i.logging_policy,
    i.history, i.candidates, i.item_id, i.propensity, i.clicked,
    s.batch, s.slot
FROM slots AS s
JOIN impressions AS i ON i.rowid = s.row_key
ORDER BY s.batch, s.slot;
