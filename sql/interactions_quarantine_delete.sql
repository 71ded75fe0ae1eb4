-- The month's quarantined interactions go before the landed files are checked again (interactions_quarantine_insert.sql,
-- in the same transaction as the partition's replacement).
DELETE FROM interactions_quarantine WHERE month = $month;
