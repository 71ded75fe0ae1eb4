-- Drop the clean partition of $month (inside the ingest transaction, before its replacement).
DELETE FROM impressions WHERE month = $month;
