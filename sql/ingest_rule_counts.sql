-- Rows per outcome of the staged month: rule = NULL is the clean count (staged rows not in ingest_violations).
SELECT NULL::VARCHAR AS rule, (SELECT count(*) FROM staging.ingest_stage) - (SELECT count(*) FROM staging.ingest_violations) AS rows
UNION ALL
SELECT rule, count(*) AS rows FROM staging.ingest_violations GROUP BY rule
ORDER BY rule NULLS FIRST;
