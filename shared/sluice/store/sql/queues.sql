-- Push queues: completed keys, the in-process dead letters and the quarantine.

-- name: key_completed
SELECT key FROM queue_completed_keys WHERE key = :key AND expires_at > :now

-- name: complete_key
INSERT INTO queue_completed_keys (key, topic, message_id, completed_at, expires_at)
VALUES (:key, :topic, :message_id, :now, :expires_at)
ON CONFLICT (key) DO UPDATE
SET message_id = excluded.message_id, completed_at = excluded.completed_at,
    expires_at = excluded.expires_at

-- name: delete_expired_keys
DELETE FROM queue_completed_keys WHERE key IN (
    SELECT key FROM queue_completed_keys WHERE expires_at < :now LIMIT :limit
)

-- name: dead_letter_add
INSERT INTO queue_dead_letters (id, topic, summary, failed_at)
VALUES (:id, :topic, :summary, :failed_at)

-- name: dead_letter_list
SELECT id, topic, summary, failed_at FROM queue_dead_letters
WHERE topic = :topic ORDER BY failed_at DESC, id LIMIT :limit

-- name: dead_letter_get
SELECT id, topic, summary, failed_at FROM queue_dead_letters WHERE topic = :topic AND id = :id

-- name: dead_letter_delete
DELETE FROM queue_dead_letters WHERE topic = :topic AND id = :id

-- name: dead_letter_count
SELECT count(*) AS n FROM queue_dead_letters WHERE topic = :topic

-- name: dead_letter_purge
DELETE FROM queue_dead_letters WHERE topic = :topic

-- name: keys_completed @sqlite
SELECT key FROM queue_completed_keys
WHERE key IN (SELECT value FROM json_each(:keys)) AND expires_at > :now

-- name: keys_completed @postgres
SELECT key FROM queue_completed_keys
WHERE key IN (SELECT jsonb_array_elements_text(:keys)) AND expires_at > :now

-- name: quarantine_add
INSERT INTO queue_quarantine (id, topic, message_id, reason, body, received_at)
VALUES (:id, :topic, :message_id, :reason, :body, :received_at)
ON CONFLICT (id) DO NOTHING

-- name: quarantine_list
SELECT id, topic, message_id, reason, body, received_at FROM queue_quarantine
ORDER BY received_at DESC, id LIMIT :limit

-- name: quarantine_get
SELECT id, topic, message_id, reason, body, received_at FROM queue_quarantine WHERE id = :id

-- name: quarantine_delete
DELETE FROM queue_quarantine WHERE id = :id

-- name: quarantine_count
SELECT count(*) AS n FROM queue_quarantine

-- name: quarantine_purge
DELETE FROM queue_quarantine
