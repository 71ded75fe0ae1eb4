-- Per arm, the clean staged rows (ingest_stage less ingest_violations) with two or more candidates, and how many of
-- them logged a propensity of at least $at_least (abpo.warehouse.ingest.NEAR_ONE_PROPENSITY: e0 ~ 1, the logging
-- near-deterministic); the logging rules they name (the first three, and how many in all), and whether any is an LLM
-- arm's softmax(tau=X) or a ranker's softmax(score/T, T=X). A row with one candidate is left out: its propensity is 1
-- whatever the temperature.
SELECT
    s.arm,
    count(*) AS rows,
    count(*) FILTER (WHERE s.propensity >= $at_least) AS near_one,
    list_slice(list(DISTINCT s.logging_policy ORDER BY s.logging_policy), 1, 3) AS policies,
    count(DISTINCT s.logging_policy) AS n_policies,
    bool_or(starts_with(s.logging_policy, 'softmax(tau=')) AS llm_rule,
    bool_or(starts_with(s.logging_policy, 'softmax(score/T, T=')) AS ranker_rule
FROM staging.ingest_stage AS s
ANTI JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row
WHERE length(s.candidates) >= 2
GROUP BY s.arm
ORDER BY s.arm;
