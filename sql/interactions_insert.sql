-- The month's landed interactions ($files: its Parquet files, INTERACTIONS_SCHEMA) as its partition of
-- `interactions`, after interactions_delete_month.sql in the same transaction. $sources: where each file of $files
-- came from, in the same order (the files themselves for a local landing zone; the objects' URIs for an
-- object-store one, read from a local copy), recorded as source_file. With $check_catalog only the rows whose item
-- is in staging.ingest_catalog (the others: interactions_quarantine_insert.sql).
INSERT INTO interactions (month, user_id, item_id, event_time, position, source_file)
SELECT $month, user_id, item_id, event_time, position, coalesce($sources[list_position($files, filename)], filename)
FROM read_parquet($files, filename = true)
WHERE NOT $check_catalog OR item_id IN (SELECT item_id FROM staging.ingest_catalog);
