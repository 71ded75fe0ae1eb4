-- Record one successful ingest in the audit table.
INSERT INTO ingest_runs
VALUES ($month, now(), $files::VARCHAR[], $rows_in, $rows_clean, $rows_quarantined, $rows_replaced,
        MAP($rules::VARCHAR[], $rule_counts::BIGINT[]));
