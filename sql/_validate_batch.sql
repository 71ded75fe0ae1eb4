-- The batch the Great Expectations suite reads (abpo/validation.py), shared by validate_month.sql (the clean
-- partition of a month) and validate_staged.sql (the staged clean rows of the ingest in progress): each defines
-- the CTE `src`, the rows to check, then includes this file (`-- @include _validate_batch`, expanded by
-- Warehouse.sql_text; not run on its own). Its columns:
-- scalar contract columns plus derived checks of the list columns, which GX cannot look inside.
-- Materialised as staging.validate_batch (the in-memory staging database, spilling under the memory limit): GX
-- reads it through SQL and computes every expectation as an aggregate query; the rows never reach pandas.
-- The round-3 propensity checks (sql/ingest_check.sql): logged_item_count (the exposed item's copies among the
-- candidates, must be 1), candidates_unique, propensity_consistent (M = 1 gives p = 1), and items_in_catalog (the
-- exposed item, candidates and history all in staging.ingest_catalog; true for every row when that table is empty:
-- no catalog given).
off_catalog AS (
    SELECT DISTINCT r.source_file, r.source_row
    FROM (SELECT source_file, source_row, unnest(list_concat([item_id], candidates, history)) AS it FROM src
          WHERE (SELECT count(*) FROM staging.ingest_catalog) > 0) AS r
    ANTI JOIN staging.ingest_catalog AS c ON r.it = c.item_id
)
SELECT
    impression_id,
    event_time AT TIME ZONE 'UTC'                      AS event_time,  -- UTC wall time: GX fetches plain timestamps
    user_id,
    arm,
    model_version,
    item_id,
    propensity,
    clicked,
    request_id,
    position,
    logging_policy,
    served_at AT TIME ZONE 'UTC'                       AS served_at,
    schema_version,
    strftime(event_time AT TIME ZONE 'UTC', '%Y-%m')   AS event_month,
    list_contains(candidates, item_id)                  AS item_in_candidates,
    length(candidates)                                  AS candidate_count,
    length(history)                                     AS history_length,
    trim(impression_id) <> '' AND trim(request_id) <> '' AND trim(model_version) <> '' AS ids_nonempty,
    abs(epoch(served_at) - epoch(event_time))           AS serve_skew_seconds,
    -- $logging_policy_re: abpo.data.schemas.LOGGING_POLICY_PATTERN, as in ingest_check.sql
    coalesce(regexp_full_match(logging_policy, $logging_policy_re)
             AND TRY_CAST(regexp_extract(logging_policy, $logging_policy_re, 1) AS DOUBLE) > 0,
             false)                                     AS logging_policy_ok,
    length(list_filter(candidates, lambda c: c = s.item_id)) AS logged_item_count,
    length(list_distinct(candidates)) = length(candidates) AS candidates_unique,
    length(candidates) <> 1 OR abs(propensity - 1) <= $single_candidate_tolerance AS propensity_consistent,
    o.source_row IS NULL                                AS items_in_catalog
FROM src AS s
LEFT JOIN off_catalog AS o ON s.source_file = o.source_file AND s.source_row = o.source_row;
