-- The staged clean rows of the month being ingested (ingest_stage less ingest_violations, before they are published), as the Great
-- Expectations suite sees them (abpo/validation.py; the same columns as validate_month.sql):
-- scalar contract columns plus derived checks of the list columns, which GX cannot look inside.
SELECT
    impression_id,
    event_time,
    user_id,
    arm,
    model_version,
    item_id,
    propensity,
    clicked,
    request_id,
    position,
    logging_policy,
    served_at,
    schema_version,
    strftime(event_time AT TIME ZONE 'UTC', '%Y-%m')   AS event_month,
    list_contains(candidates, item_id)                  AS item_in_candidates,
    length(candidates)                                  AS candidate_count,
    length(history)                                     AS history_length
FROM ingest_stage AS s
ANTI JOIN ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row
ORDER BY source_file, source_row;
