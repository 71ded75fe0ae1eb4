-- Keep the clean rows of $month that are about to be replaced as the month's next history version.
INSERT INTO impressions_history
SELECT *, now() AS replaced_at,
       coalesce((SELECT max(version) FROM impressions_history WHERE month = $month), 0) + 1 AS version
FROM impressions
WHERE month = $month;
