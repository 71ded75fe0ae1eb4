-- Rows per outcome of the staged month: rule = NULL is the clean count.
SELECT rule, count(*) AS rows
FROM ingest_checked
GROUP BY rule
ORDER BY rule NULLS FIRST;
