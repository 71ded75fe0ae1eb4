-- With $check_catalog, the month's landed interactions ($files) whose item is not in staging.ingest_catalog go to
-- interactions_quarantine (rule item_not_in_catalog) instead of `interactions` (interactions_insert.sql leaves
-- them out): the ranker arms' refits never see them. $sources: where each file came from (interactions_insert.sql).
INSERT INTO interactions_quarantine (month, rule, detail, user_id, item_id, event_time, position, source_file)
SELECT $month, 'item_not_in_catalog', 'item_id ' || item_id || ' is not in the catalog', user_id, item_id, event_time,
       position, coalesce($sources[list_position($files, filename)], filename)
FROM read_parquet($files, filename = true)
WHERE $check_catalog AND item_id NOT IN (SELECT item_id FROM staging.ingest_catalog);
