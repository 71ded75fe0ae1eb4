-- Drop history version $version of $month (it was restored into impressions).
DELETE FROM impressions_history WHERE month = $month AND version = $version;
