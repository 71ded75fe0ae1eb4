-- The checked rows that broke no rule become $month's partition.
INSERT INTO impressions
SELECT
    $month AS month,
    impression_id, event_time, user_id, arm, model_version, history, candidates, item_id,
    propensity, clicked, request_id, position, logging_policy, served_at, schema_version,
    source_file, source_row
FROM ingest_checked
WHERE rule IS NULL;
