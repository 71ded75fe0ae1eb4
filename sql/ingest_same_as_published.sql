-- Whether the staged clean rows of $month are exactly the rows the month holds now (every stored column, as a
-- multiset; the caller checked that the counts are equal): a rerun on the same landing files. The ingest then keeps
-- no history version of the replaced rows, since they are the new ones, so retries do not grow impressions_history.
SELECT NOT EXISTS (
    SELECT impression_id, event_time, user_id, arm, model_version, history, candidates, item_id, propensity, clicked,
           request_id, position, logging_policy, served_at, schema_version, source_file, source_row
    FROM staging.ingest_stage AS s
    ANTI JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row
    EXCEPT ALL
    SELECT impression_id, event_time, user_id, arm, model_version, history, candidates, item_id, propensity, clicked,
           request_id, position, logging_policy, served_at, schema_version, source_file, source_row
    FROM impressions
    WHERE month = $month
) AS same;
