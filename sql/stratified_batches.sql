-- The stratified mini-batches of the given months ($months), streamed in (batch, slot) order: each stratum's rows are
-- numbered in the stable order of stratify_positive.sql / stratify_no_response.sql (month, impression_id), joined to
-- the batch plan the caller registered (batch_plan_positive, batch_plan_no_response: rank, batch, slot; see
-- abpo.warehouse.stratified_batch_plan), so a row the plan recycles appears once per slot it fills. DuckDB sorts
-- and spills; the caller reads the result a chunk at a time.
WITH positive AS (
    SELECT
        row_number() OVER (ORDER BY month, impression_id) - 1 AS rank,
        month, impression_id, request_id, user_id, arm, model_version, logging_policy,
        history, candidates, item_id, propensity, clicked
    FROM impressions_positive
    WHERE list_contains($months::VARCHAR[], month)
),
no_response AS (
    SELECT
        row_number() OVER (ORDER BY month, impression_id) - 1 AS rank,
        month, impression_id, request_id, user_id, arm, model_version, logging_policy,
        history, candidates, item_id, propensity, clicked
    FROM impressions_no_response
    WHERE list_contains($months::VARCHAR[], month)
)
SELECT r.* EXCLUDE (rank), p.batch, p.slot
FROM batch_plan_positive AS p JOIN positive AS r ON p.rank = r.rank
UNION ALL
SELECT r.* EXCLUDE (rank), p.batch, p.slot
FROM batch_plan_no_response AS p JOIN no_response AS r ON p.rank = r.rank
ORDER BY batch, slot;
