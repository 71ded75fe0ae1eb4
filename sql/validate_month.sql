-- The clean partition of $month as the Great Expectations suite sees it (abpo/validation.py):
-- scalar contract columns plus derived checks of the list columns, which GX cannot look inside.
-- Materialised as staging.validate_batch (the in-memory staging database, spilling under the memory limit): GX
-- reads it through SQL and computes every expectation as an aggregate query; the rows never reach pandas.
CREATE OR REPLACE TABLE staging.validate_batch AS
SELECT
    impression_id,
    event_time AT TIME ZONE 'UTC'                      AS event_time,  -- UTC wall time: GX fetches plain timestamps
    user_id,
    arm,
    model_version,
    item_id,
    propensity,
    clicked,
    request_id,
    position,
    logging_policy,
    served_at AT TIME ZONE 'UTC'                       AS served_at,
    schema_version,
    strftime(event_time AT TIME ZONE 'UTC', '%Y-%m')   AS event_month,
    list_contains(candidates, item_id)                  AS item_in_candidates,
    length(candidates)                                  AS candidate_count,
    length(history)                                     AS history_length
FROM impressions
WHERE month = $month;
