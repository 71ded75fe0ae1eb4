-- Free the staging tables of the last ingest.
DROP TABLE IF EXISTS ingest_checked;
DROP TABLE IF EXISTS ingest_stage;
