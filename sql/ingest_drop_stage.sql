-- Free the staging tables of the last ingest.
DROP TABLE IF EXISTS ingest_violations;
DROP TABLE IF EXISTS ingest_stage;
