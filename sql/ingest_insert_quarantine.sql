-- The staged rows that broke a rule go to quarantine with that rule.
INSERT INTO quarantine
SELECT
    $month AS month, v.rule, v.detail, s.source_file, s.source_row,
    s.impression_id, s.event_time, s.user_id, s.arm, s.model_version, s.history, s.candidates, s.item_id,
    s.propensity, s.clicked, s.request_id, s.position, s.logging_policy, s.served_at, s.schema_version
FROM staging.ingest_stage AS s
JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row;
