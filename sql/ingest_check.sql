-- Apply the impressions contract to the staged rows. The result, ingest_violations, holds only the rows that break a
-- rule (source_file, source_row, rule, detail): `rule` is the first rule the row breaks (in this priority order),
-- `detail` says which field or value. A staged row not in it is clean. Only this narrow table is written: the staged
-- rows themselves are read once more by the insert steps (clean = staged ANTI JOIN violations), never copied here.
--   null_field               any contract column is null (or a null inside history/candidates)
--   empty_field              impression_id, request_id or model_version is empty or only spaces (a key that
--                            identifies nothing)
--   malformed_id             impression_id, request_id or model_version holds a control character (NUL, newline,
--                            ...) or a bidirectional override (U+202A-U+202E, U+2066-U+2069, U+200E/F), or is longer
--                            than $max_id_length characters: an id is printed in reports and logs as one short line
--   unknown_schema_version   schema_version is not $schema_version, the version this warehouse reads (a row
--                            of another version may mean something else by the same columns)
--   unknown_arm              arm not in $known_arms
--   unknown_model_version    the row's arm has registered versions (staging.ingest_model_versions: the arms abpo
--                            serves whose registered model has versions, read from the MLflow registry by the caller;
--                            empty: not checked) and model_version is none of them: lineage to a model the
--                            registry never had
--   propensity_out_of_range  propensity not in [$min_propensity, 1] (NaN included; $min_propensity > 0 is
--                            data.min_propensity: below it the SNIPS weight e/e0 overflows or means nothing)
--   clicked_not_binary       clicked not 0/1
--   item_not_in_candidates   the exposed item_id is not one of `candidates`
--   logged_item_not_once     the exposed item_id appears more than once in `candidates` (its propensity would be
--                            the sum over its copies, not the logged one)
--   duplicate_candidates     `candidates` holds an item more than once (all-identical candidates included): a
--                            softmax over C is over distinct items
--   propensity_inconsistent  the propensity no exact softmax over the candidates can give: one candidate (M = 1)
--                            with propensity not 1 (within $single_candidate_tolerance). For M >= 2 no finite bound
--                            on p*M exists for the logging rules (their scores are unbounded), so (0, M] i.e. p <= 1
--                            is all that holds (abpo/data/schemas.py, SINGLE_CANDIDATE_PROPENSITY_TOLERANCE)
--   item_not_in_catalog      the exposed item, a candidate or a history item is not in the catalog (the dataset's
--                            items, staging.ingest_catalog; checked only when $check_catalog)
--   negative_field           user_id or position below 0 (ids and slots count from 0)
--   unknown_logging_policy   logging_policy is not a stochastic rule this warehouse knows: softmax(tau=X) (the LLM
--                            arms, abpo.policy.bandit) or softmax(score/T, T=X) <ranker> (the ranker arms), X > 0
--                            finite; off-policy estimates are only valid for such a rule
--   logging_tau_mismatch     an LLM row's softmax(tau=X) with X other than $policy_tau (policy.tau; 0: not checked):
--                            the update recomputes e_old = softmax(s/tau) with policy.tau and refuses such a row
--                            (abpo.train.dataset), so it is quarantined here instead of failing an arm's update
--   event_time_outside_month event_time (UTC) not in $month (YYYY-MM)
--   served_at_out_of_range   served_at more than $max_clock_skew_seconds (data.max_clock_skew_seconds) from
--                            event_time (a clock far off, or a replay)
--   conflicting_impression_id  otherwise-clean rows of this month that share an id but differ in any contract
--                            field: two impressions under one id. Every row of that id is quarantined, each naming
--                            the others' files and rows: which one is genuine is not known (the order of the file
--                            names is no evidence), so none is kept.
--   duplicate_impression_id  the id was already used: by an identical earlier row of this month (a writer's retry:
--                            every contract field the same; the first copy, by file name then row, is kept) or by
--                            another month.
CREATE OR REPLACE TABLE staging.ingest_violations AS
WITH item_refs AS (
    SELECT source_file, source_row, 'item_id' AS field, item_id AS it FROM staging.ingest_stage WHERE $check_catalog
    UNION ALL
    SELECT source_file, source_row, 'candidates' AS field, unnest(candidates) AS it FROM staging.ingest_stage
    WHERE $check_catalog
    UNION ALL
    SELECT source_file, source_row, 'history' AS field, unnest(history) AS it FROM staging.ingest_stage
    WHERE $check_catalog
),
off_catalog AS (
    SELECT source_file, source_row, count(DISTINCT it) AS n_items, min(it) AS example,
           string_agg(DISTINCT field, ', ' ORDER BY field) AS fields
    FROM item_refs AS r
    WHERE it IS NOT NULL AND NOT EXISTS (SELECT 1 FROM staging.ingest_catalog AS c WHERE c.item_id = r.it)
    GROUP BY source_file, source_row
),
checked_arms AS (
    -- the arms whose model_version is checked: their registered model, how many versions it has, the latest
    SELECT arm AS checked_arm, min(model) AS arm_model, count(*) AS arm_versions,
           max(TRY_CAST(model_version AS BIGINT)) AS arm_latest
    FROM staging.ingest_model_versions
    GROUP BY arm
),
ruled AS (
    SELECT
        s.source_file, s.source_row, s.impression_id, s.event_time, s.arm, s.propensity, s.clicked,
        s.candidates, s.item_id, s.schema_version, s.logging_policy, s.served_at, s.model_version,
        ca.checked_arm IS NOT NULL AND rv.registered_arm IS NULL AS version_unknown, ca.arm_model, ca.arm_versions,
        ca.arm_latest,
        length(list_filter(s.candidates, lambda c: c = s.item_id)) AS logged_copies,
        length(s.candidates) - length(list_distinct(s.candidates)) AS duplicate_slots,
        oc.n_items AS off_catalog_items, oc.example AS off_catalog_example, oc.fields AS off_catalog_fields,
        concat_ws(', ',
            CASE WHEN impression_id IS NULL THEN 'impression_id' END,
            CASE WHEN event_time IS NULL THEN 'event_time' END,
            CASE WHEN user_id IS NULL THEN 'user_id' END,
            CASE WHEN arm IS NULL THEN 'arm' END,
            CASE WHEN model_version IS NULL THEN 'model_version' END,
            CASE WHEN history IS NULL OR length(history) <> list_count(history) THEN 'history' END,
            CASE WHEN candidates IS NULL OR length(candidates) <> list_count(candidates) THEN 'candidates' END,
            CASE WHEN item_id IS NULL THEN 'item_id' END,
            CASE WHEN propensity IS NULL THEN 'propensity' END,
            CASE WHEN clicked IS NULL THEN 'clicked' END,
            CASE WHEN request_id IS NULL THEN 'request_id' END,
            CASE WHEN position IS NULL THEN 'position' END,
            CASE WHEN logging_policy IS NULL THEN 'logging_policy' END,
            CASE WHEN served_at IS NULL THEN 'served_at' END,
            CASE WHEN schema_version IS NULL THEN 'schema_version' END
        ) AS null_fields,
        concat_ws(', ',
            CASE WHEN trim(impression_id) = '' THEN 'impression_id' END,
            CASE WHEN trim(request_id) = '' THEN 'request_id' END,
            CASE WHEN trim(model_version) = '' THEN 'model_version' END
        ) AS empty_fields,
        concat_ws(', ',
            CASE WHEN regexp_matches(impression_id, $id_forbidden_re) THEN 'impression_id holds a control character' END,
            CASE WHEN regexp_matches(request_id, $id_forbidden_re) THEN 'request_id holds a control character' END,
            CASE WHEN regexp_matches(model_version, $id_forbidden_re) THEN 'model_version holds a control character' END,
            CASE WHEN length(impression_id) > $max_id_length THEN 'impression_id is ' || length(impression_id) || ' characters' END,
            CASE WHEN length(request_id) > $max_id_length THEN 'request_id is ' || length(request_id) || ' characters' END,
            CASE WHEN length(model_version) > $max_id_length THEN 'model_version is ' || length(model_version) || ' characters' END
        ) AS malformed_ids,
        concat_ws(', ',
            CASE WHEN user_id < 0 THEN 'user_id ' || user_id END,
            CASE WHEN position < 0 THEN 'position ' || position END
        ) AS negative_fields,
        -- $logging_policy_re: abpo.data.schemas.LOGGING_POLICY_PATTERN (group 1: the temperature, which must be > 0)
        coalesce(regexp_full_match(logging_policy, $logging_policy_re)
                 AND TRY_CAST(regexp_extract(logging_policy, $logging_policy_re, 1) AS DOUBLE) > 0, false) AS policy_ok,
        -- an LLM arm's rule (softmax(tau=X), not a ranker's softmax(score/T, T=X)) with X other than policy.tau
        coalesce($policy_tau > 0 AND starts_with(logging_policy, 'softmax(tau=')
                 AND abs(TRY_CAST(regexp_extract(logging_policy, $logging_policy_re, 1) AS DOUBLE) - $policy_tau)
                     > 1e-9 * greatest(1.0, $policy_tau), false) AS tau_mismatch,
        abs(epoch(served_at) - epoch(event_time)) AS skew_seconds
    FROM staging.ingest_stage AS s
    LEFT JOIN off_catalog AS oc ON s.source_file = oc.source_file AND s.source_row = oc.source_row
    LEFT JOIN checked_arms AS ca ON s.arm = ca.checked_arm
    LEFT JOIN (SELECT arm AS registered_arm, model_version AS registered_version FROM staging.ingest_model_versions)
        AS rv ON s.arm = rv.registered_arm AND s.model_version = rv.registered_version
),
first_rule AS MATERIALIZED (
    SELECT
        source_file, source_row, impression_id,
        CASE
            WHEN null_fields <> '' THEN 'null_field'
            WHEN empty_fields <> '' THEN 'empty_field'
            WHEN malformed_ids <> '' THEN 'malformed_id'
            WHEN schema_version <> $schema_version THEN 'unknown_schema_version'
            WHEN NOT list_contains($known_arms::VARCHAR[], arm) THEN 'unknown_arm'
            WHEN version_unknown THEN 'unknown_model_version'
            WHEN isnan(propensity) OR propensity < $min_propensity OR propensity > 1 THEN 'propensity_out_of_range'
            WHEN clicked NOT IN (0, 1) THEN 'clicked_not_binary'
            WHEN NOT list_contains(candidates, item_id) THEN 'item_not_in_candidates'
            WHEN logged_copies > 1 THEN 'logged_item_not_once'
            WHEN duplicate_slots > 0 THEN 'duplicate_candidates'
            WHEN length(candidates) = 1 AND abs(propensity - 1) > $single_candidate_tolerance THEN 'propensity_inconsistent'
            WHEN off_catalog_items > 0 THEN 'item_not_in_catalog'
            WHEN negative_fields <> '' THEN 'negative_field'
            WHEN NOT policy_ok THEN 'unknown_logging_policy'
            WHEN tau_mismatch THEN 'logging_tau_mismatch'
            WHEN strftime(event_time AT TIME ZONE 'UTC', '%Y-%m') <> $month THEN 'event_time_outside_month'
            WHEN skew_seconds > $max_clock_skew_seconds THEN 'served_at_out_of_range'
        END AS rule,
        CASE
            WHEN null_fields <> '' THEN 'null in: ' || null_fields
            WHEN empty_fields <> '' THEN 'empty: ' || empty_fields
            WHEN malformed_ids <> '' THEN malformed_ids || '; rule: an id is at most ' || $max_id_length || ' characters with no control character or bidirectional override'
            WHEN schema_version <> $schema_version THEN 'schema_version ' || schema_version || ', this warehouse reads version ' || $schema_version
            WHEN NOT list_contains($known_arms::VARCHAR[], arm) THEN 'arm ' || arm || ' not in known arms'
            WHEN version_unknown THEN 'model_version ' || model_version || ' of arm ' || arm || ' is not a version of ' || arm_model || ' (' || arm_versions || ' registered, the latest ' || coalesce(arm_latest::VARCHAR, '?') || '); rule: a row of an arm abpo serves names the registered version that served it'
            WHEN isnan(propensity) OR propensity <= 0 OR propensity > 1 THEN 'propensity ' || propensity || ' not in (0, 1]'
            WHEN propensity < $min_propensity THEN 'propensity ' || propensity || ' below data.min_propensity ' || $min_propensity
            WHEN clicked NOT IN (0, 1) THEN 'clicked ' || clicked || ' not in {0, 1}'
            WHEN NOT list_contains(candidates, item_id) THEN 'item_id ' || item_id || ' not among ' || length(candidates) || ' candidates'
            WHEN logged_copies > 1 THEN 'item_id ' || item_id || ' appears ' || logged_copies || ' times among ' || length(candidates) || ' candidates; rule: the logged item appears exactly once'
            WHEN duplicate_slots > 0 THEN length(candidates) || ' candidates hold ' || length(list_distinct(candidates)) || ' distinct items; rule: candidates are unique within a row'
            WHEN length(candidates) = 1 AND abs(propensity - 1) > $single_candidate_tolerance THEN 'propensity ' || propensity || ' for the only candidate; rule: softmax over M = 1 candidate gives exactly 1 (p*M in (0, M])'
            WHEN off_catalog_items > 0 THEN off_catalog_items || ' item id(s) not in the catalog, e.g. ' || off_catalog_example || ' (in ' || off_catalog_fields || ')'
            WHEN negative_fields <> '' THEN negative_fields || ' < 0'
            WHEN NOT policy_ok THEN 'logging_policy ' || logging_policy || ' is not softmax(tau=X) or softmax(score/T, T=X) <ranker> with X > 0'
            WHEN tau_mismatch THEN 'logging_policy ' || logging_policy || ' but policy.tau = ' || $policy_tau || '; rule: the update recomputes e_old = softmax(s/tau) with policy.tau, so an LLM row is logged with that tau'
            WHEN strftime(event_time AT TIME ZONE 'UTC', '%Y-%m') <> $month THEN 'event_time ' || event_time || ' outside ' || $month
            WHEN skew_seconds > $max_clock_skew_seconds THEN 'served_at ' || served_at || ' is ' || round(skew_seconds) || ' s from event_time ' || event_time || ', more than ' || $max_clock_skew_seconds || ' s (data.max_clock_skew_seconds)'
        END AS detail
    FROM ruled
),
dup_ids AS (
    -- ids used by more than one otherwise-clean row (a hash aggregate; only these rows are compared)
    SELECT impression_id FROM first_rule WHERE rule IS NULL GROUP BY impression_id HAVING count(*) > 1
),
dup_rows AS (
    -- the rows of those ids with what they say: every contract column (an identical row is a retry, any other a
    -- conflict)
    SELECT
        f.source_file, f.source_row, f.impression_id,
        f.source_file || ' row ' || f.source_row AS at_row,
        {'event_time': s.event_time, 'user_id': s.user_id, 'arm': s.arm, 'model_version': s.model_version,
         'history': s.history, 'candidates': s.candidates, 'item_id': s.item_id, 'propensity': s.propensity,
         'clicked': s.clicked, 'request_id': s.request_id, 'position': s.position,
         'logging_policy': s.logging_policy, 'served_at': s.served_at, 'schema_version': s.schema_version} AS content
    FROM first_rule AS f
    JOIN staging.ingest_stage AS s ON f.source_file = s.source_file AND f.source_row = s.source_row
    WHERE f.rule IS NULL AND f.impression_id IN (SELECT impression_id FROM dup_ids)
),
id_groups AS (
    SELECT impression_id, count(*) AS n_rows, count(DISTINCT content) AS n_distinct,
           list(at_row ORDER BY source_file, source_row) AS at_rows
    FROM dup_rows
    GROUP BY impression_id
),
copies AS (
    SELECT
        d.source_file, d.source_row, d.at_row, g.n_rows, g.n_distinct, g.at_rows,
        row_number() OVER w AS copy_no,
        first_value(d.at_row) OVER w AS first_copy
    FROM dup_rows AS d
    JOIN id_groups AS g ON d.impression_id = g.impression_id
    WINDOW w AS (PARTITION BY d.impression_id, d.content ORDER BY d.source_file, d.source_row)
),
other_months AS (
    SELECT DISTINCT impression_id, month FROM impressions
    WHERE month <> $month AND impression_id IN (SELECT impression_id FROM staging.ingest_stage)
)
SELECT * FROM (
    SELECT
        c.source_file,
        c.source_row,
        CASE
            WHEN c.rule IS NOT NULL THEN c.rule
            WHEN d.n_distinct > 1 THEN 'conflicting_impression_id'
            WHEN d.copy_no > 1 OR o.impression_id IS NOT NULL THEN 'duplicate_impression_id'
        END AS rule,
        CASE
            WHEN c.rule IS NOT NULL THEN c.detail
            WHEN d.n_distinct > 1 THEN
                'impression_id ' || c.impression_id || ' is used by '
                || CASE WHEN d.n_distinct = d.n_rows THEN d.n_rows || ' different rows'
                        ELSE d.n_rows || ' rows (' || d.n_distinct || ' different)' END
                || ': ' || array_to_string(list_filter(d.at_rows, lambda x: x <> d.at_row)[1:5], ', ')
                || CASE WHEN d.n_rows > 6 THEN ' and ' || (d.n_rows - 6) || ' more' ELSE '' END
                || ' besides this one; rule: one impression per id (rows that differ under one id are all '
                || 'quarantined: which is genuine is not known)'
            WHEN d.copy_no > 1 THEN
                'impression_id ' || c.impression_id || ': a retry of ' || d.first_copy
                || ' (every field the same), kept once'
            WHEN o.impression_id IS NOT NULL THEN 'impression_id ' || c.impression_id || ' already in month ' || o.month
        END AS detail
    FROM first_rule AS c
    LEFT JOIN copies AS d ON c.source_file = d.source_file AND c.source_row = d.source_row
    LEFT JOIN (SELECT impression_id, min(month) AS month FROM other_months GROUP BY impression_id) AS o
        ON c.impression_id = o.impression_id
)
WHERE rule IS NOT NULL;
