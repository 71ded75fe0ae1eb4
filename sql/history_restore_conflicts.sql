-- Impression ids of history version $version of $month that are now in another month's clean partition (ingested
-- there after the version was replaced): restoring it would put them in two months. The ingest's
-- duplicate_impression_id rule (ingest_check.sql) keeps every id in one month; restore_month refuses on any row here.
WITH clash AS (
    SELECT h.impression_id, min(i.month) AS other_month
    FROM impressions_history AS h
    JOIN impressions AS i ON i.impression_id = h.impression_id AND i.month <> $month
    WHERE h.month = $month AND h.version = $version
    GROUP BY h.impression_id
)
SELECT impression_id, other_month, count(*) OVER () AS conflicts
FROM clash
ORDER BY impression_id
LIMIT 20;
