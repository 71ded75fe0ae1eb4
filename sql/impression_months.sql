-- Every month the warehouse knows: months holding clean impressions and months with an ingest run
-- (a month whose rows were all quarantined has a run but no clean row). A scan of `impressions.month`.
SELECT month FROM impressions
UNION
SELECT month FROM ingest_runs
ORDER BY month;
