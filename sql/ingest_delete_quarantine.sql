-- Drop $month's quarantined rows (inside the ingest transaction, before their replacement).
DELETE FROM quarantine WHERE month = $month;
