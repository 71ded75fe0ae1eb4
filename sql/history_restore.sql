-- Put history version $version of $month back into impressions (the caller saved and deleted the current rows;
-- history_drop.sql then removes the version from the history).
INSERT INTO impressions
SELECT * EXCLUDE (replaced_at, version) FROM impressions_history WHERE month = $month AND version = $version;
