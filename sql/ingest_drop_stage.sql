-- Free the staging tables of the last ingest.
DROP TABLE IF EXISTS staging.ingest_violations;
DROP TABLE IF EXISTS staging.validate_batch;
DROP TABLE IF EXISTS staging.ingest_stage;
DROP TABLE IF EXISTS staging.ingest_catalog;
DROP TABLE IF EXISTS staging.ingest_model_versions;
