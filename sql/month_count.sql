-- Clean rows currently held for $month.
SELECT count(*) AS rows FROM impressions WHERE month = $month;
