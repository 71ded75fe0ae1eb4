-- What every user consumed in the months up to and including $month (YYYY-MM), per user in sequence order: with
-- the users' histories before the first month and the clicks (clicks_to_date.sql), what the ranker arms are refitted
-- on (abpo.monthly.refit); with arms.gate_users = warehouse, where the gate's held-out users come from
-- (abpo.monthly.gate). month, position and source_file say where each row came from.
SELECT user_id, item_id, month, position, source_file
FROM interactions
WHERE month <= $month
ORDER BY user_id, month, position;
