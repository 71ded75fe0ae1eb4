-- The month's landed interactions ($files: its Parquet files, INTERACTIONS_SCHEMA) as its partition of
-- `interactions`, after interactions_delete_month.sql in the same transaction.
INSERT INTO interactions (month, user_id, item_id, event_time, position, source_file)
SELECT $month, user_id, item_id, event_time, position, filename
FROM read_parquet($files, filename = true);
