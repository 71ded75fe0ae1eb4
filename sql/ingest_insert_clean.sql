-- The staged rows that broke no rule (not in ingest_violations) become $month's partition.
INSERT INTO impressions
SELECT
    $month AS month,
    s.impression_id, s.event_time, s.user_id, s.arm, s.model_version, s.history, s.candidates, s.item_id,
    s.propensity, s.clicked, s.request_id, s.position, s.logging_policy, s.served_at, s.schema_version,
    s.source_file, s.source_row
FROM staging.ingest_stage AS s
ANTI JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row;
