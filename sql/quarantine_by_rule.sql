-- Quarantined rows per month and rule (what ingest set aside, and why).
SELECT month, rule, count(*) AS rows
FROM quarantine
WHERE $months::VARCHAR[] IS NULL OR list_contains($months::VARCHAR[], month)
GROUP BY month, rule
ORDER BY month, rule;
