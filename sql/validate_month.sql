-- The clean partition of $month as the Great Expectations suite sees it (abpo/validation.py): the rows `src`
-- with the columns and derived checks of _validate_batch.sql (shared with validate_staged.sql).
CREATE OR REPLACE TABLE staging.validate_batch AS
WITH src AS (
    SELECT s.* FROM impressions AS s
    WHERE month = $month
),
-- @include _validate_batch
