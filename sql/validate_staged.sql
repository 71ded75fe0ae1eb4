-- The staged clean rows of the month being ingested (ingest_stage less ingest_violations, before they are
-- published), as the Great Expectations suite sees them (abpo/validation.py): the rows `src` with the columns
-- and derived checks of _validate_batch.sql (shared with validate_month.sql).
CREATE OR REPLACE TABLE staging.validate_batch AS
WITH src AS (
    SELECT s.* FROM staging.ingest_stage AS s
    ANTI JOIN staging.ingest_violations AS v ON s.source_file = v.source_file AND s.source_row = v.source_row
),
-- @include _validate_batch
