-- The distinct users of the clean impressions of the given months ($months, YYYY-MM list), ascending: the users an
-- update's strata could hold (the gate's held-out slice is chosen among them, abpo.data.holdout).
SELECT DISTINCT user_id
FROM impressions
WHERE list_contains($months::VARCHAR[], month)
ORDER BY user_id;
