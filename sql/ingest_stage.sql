-- Stage one month's landing files as they are, with the file and row each row came from.
-- $files: absolute paths of the month's Parquet files (schemas already checked by the runner).
CREATE OR REPLACE TABLE staging.ingest_stage AS
SELECT
    * EXCLUDE (filename, file_row_number),
    regexp_extract(filename, '[^/]+$') AS source_file,
    file_row_number AS source_row
FROM read_parquet($files, filename = true, file_row_number = true);
