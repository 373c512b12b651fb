-- Operations history samples (the console's charts).

-- name: add_sample
INSERT INTO ops_samples (id, kind, name, at, value, outcome)
VALUES (:id, :kind, :name, :at, :value, :outcome)

-- name: latest_at
SELECT max(at) AS at FROM ops_samples WHERE kind = :kind

-- name: series
SELECT name, at, value, outcome FROM ops_samples
WHERE kind = :kind AND at >= :since
ORDER BY name, at

-- name: prune_batch
DELETE FROM ops_samples WHERE id IN (
    SELECT id FROM ops_samples WHERE at < :cutoff LIMIT :limit
)
