-- Every click logged by any arm in the months up to and including $month (YYYY-MM), oldest first: the clicks the
-- ranker arms are refitted on (abpo.monthly.refit).
SELECT user_id, item_id, event_time
FROM impressions
WHERE clicked = 1 AND month <= $month
ORDER BY event_time, impression_id;
