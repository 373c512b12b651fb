-- The chunks of chunked delivery entries the platform accepted
-- (shared/sluice/store/migrations/0019_delivery_chunks.*.sql).

-- name: chunks_of
SELECT chunk, message_id FROM delivery_chunks WHERE entry_id = :entry_id ORDER BY chunk

-- name: chunk_accepted
-- A fact about the platform, whoever holds the entry now: the first answer recorded stays.
INSERT INTO delivery_chunks (entry_id, chunk, message_id, accepted_at)
VALUES (:entry_id, :chunk, :message_id, :now)
ON CONFLICT (entry_id, chunk) DO NOTHING
