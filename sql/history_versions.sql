-- The replaced versions of $month kept in impressions_history, oldest first.
SELECT version, count(*) AS rows, min(replaced_at) AS replaced_at
FROM impressions_history
WHERE month = $month
GROUP BY version
ORDER BY version;
