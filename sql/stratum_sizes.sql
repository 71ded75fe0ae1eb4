-- P (positive rows, B_1) and N (no-response rows, B_0) of the given months ($months, YYYY-MM list).
SELECT
    count(*) FILTER (WHERE clicked = 1) AS positive,
    count(*) FILTER (WHERE clicked = 0) AS no_response
FROM impressions
WHERE list_contains($months::VARCHAR[], month);
