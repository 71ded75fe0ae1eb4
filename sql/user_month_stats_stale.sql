-- Months whose per-user aggregate is missing or out of date: ingested (ingest_runs) but never built, or
-- built from a different number of ingest runs than the month has now (ingested again by code that did
-- not maintain the aggregate). A month built by a rebuild without any ingest run (rows written into
-- `impressions` directly, as benchmarks/report.py does) is recorded with 0 runs and stays current.
WITH runs AS (
    SELECT month, count(*) AS ingest_runs FROM ingest_runs GROUP BY month
)
SELECT coalesce(r.month, b.month) AS month,
       CASE WHEN b.month IS NULL THEN 'never built'
            ELSE 'built from ' || b.ingest_runs || ' ingest run(s), the month has ' || coalesce(r.ingest_runs, 0)
       END AS reason
FROM runs AS r
FULL OUTER JOIN user_month_stats_built AS b ON r.month = b.month
WHERE b.month IS NULL OR b.ingest_runs <> coalesce(r.ingest_runs, 0)
ORDER BY 1;
