-- The staged clean rows of the month being ingested (ingest_stage less ingest_violations, before they are published), as the Great
-- Expectations suite sees them (abpo/validation.py; the same columns as validate_month.sql):
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
    length(history)                                     AS history_length,
    trim(impression_id) <> '' AND trim(request_id) <> '' AND trim(model_version) <> '' AS ids_nonempty,
    abs(epoch(served_at) - epoch(event_time))           AS serve_skew_seconds,
    -- $logging_policy_re: abpo.data.schemas.LOGGING_POLICY_PATTERN, as in ingest_check.sql
    coalesce(regexp_full_match(logging_policy, $logging_policy_re)
             AND TRY_CAST(regexp_extract(logging_policy, $logging_policy_re, 1) AS DOUBLE) > 0, false) AS logging_policy_ok
FROM staging.ingest_stage AS s
ANTI JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row;
