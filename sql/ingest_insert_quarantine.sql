-- The checked rows that broke a rule go to quarantine with that rule.
INSERT INTO quarantine
SELECT
    $month AS month, rule, detail, source_file, source_row,
    impression_id, event_time, user_id, arm, model_version, history, candidates, item_id,
    propensity, clicked, request_id, position, logging_policy, served_at, schema_version
FROM ingest_checked
WHERE rule IS NOT NULL;
