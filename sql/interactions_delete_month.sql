-- The month's partition of `interactions` goes before the landed files replace it (interactions_insert.sql, in the
-- same transaction): a rerun gives the same rows, never doubles.
DELETE FROM interactions WHERE month = $month;
