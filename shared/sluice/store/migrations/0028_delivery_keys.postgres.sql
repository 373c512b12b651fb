-- Where an entry goes, decided once when it is enqueued (shared/sluice/delivery/keys.py):
-- destination is <channel>:<recipient> (the exact URL or chat: where "gone" lives) and
-- receiver is where its rates and outages live (a webhook's host:port, email:smtp, else
-- the destination). Every statement that selects a destination's entries reads these two
-- columns; the claim reads the state of both (delivery_destinations) for each entry, so
-- no entry is held by moving it any more: held_by is left to channels without an adapter.
ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS receiver text NULL;
-- an operator's restart (redrive, send again, replay): a disabled destination lets it
-- through once, as the operator asked
ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS restarted_at timestamptz NULL;
-- a receiver's next moment with a rate slot, or the wait a provider named: nothing of it
-- is claimed before then
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS ready_at timestamptz NULL;
-- the one entry whose answered failures began its current failure streak: a second entry
-- failing in the same streak makes the failure the receiver's, not the entry's
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS suspect_entry text NULL;

UPDATE delivery_queue SET destination = channel || ':' || recipient,
    receiver = CASE
        WHEN channel = 'email' THEN 'email:smtp'
        WHEN channel <> 'webhook' THEN channel || ':' || recipient
        ELSE 'webhook:' || (
            SELECT CASE
                WHEN hp ~ '^\[.*\]:[0-9]+$' THEN regexp_replace(hp, '^\[(.*)\](:[0-9]+)$', '\1\2')
                WHEN hp ~ '^\[.*\]$' THEN regexp_replace(hp, '^\[(.*)\]$', '\1')
                    || CASE WHEN scheme = 'http' THEN ':80' ELSE ':443' END
                WHEN hp ~ ':[0-9]*$' THEN hp
                ELSE hp || CASE WHEN scheme = 'http' THEN ':80' ELSE ':443' END END
            FROM (SELECT lower(substring(recipient from '^([A-Za-z][A-Za-z0-9+.-]*)://')) AS scheme,
                         substring(recipient from '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)') AS hp) u)
        END;
UPDATE delivery_queue SET receiver = destination WHERE receiver IS NULL;

-- No entry stays held by a failing or paused destination: the claim reads their state.
UPDATE delivery_queue SET held_by = NULL
WHERE held_by IS NOT NULL AND held_by NOT LIKE 'unconfigured:%';

DROP INDEX IF EXISTS delivery_queue_held_due_idx;
CREATE INDEX IF NOT EXISTS delivery_queue_receiver_due_idx
    ON delivery_queue (receiver, next_attempt_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS delivery_queue_receiver_idx ON delivery_queue (receiver, status);
