-- Where an entry goes, decided once when it is enqueued (shared/sluice/delivery/keys.py):
-- destination is <channel>:<recipient> (the exact URL or chat: where "gone" lives) and
-- receiver is where its rates and outages live (a webhook's host:port, email:smtp, else
-- the destination). Every statement that selects a destination's entries reads these two
-- columns; the claim reads the state of both (delivery_destinations) for each entry, so
-- no entry is held by moving it any more: held_by is left to channels without an adapter.
ALTER TABLE delivery_queue ADD COLUMN receiver text NULL;
-- an operator's restart (redrive, send again, replay): a disabled destination lets it
-- through once, as the operator asked
ALTER TABLE delivery_queue ADD COLUMN restarted_at timestamptz NULL;
-- a receiver's next moment with a rate slot, or the wait a provider named: nothing of it
-- is claimed before then
ALTER TABLE delivery_destinations ADD COLUMN ready_at timestamptz NULL;
-- the one entry whose answered failures began its current failure streak: a second entry
-- failing in the same streak makes the failure the receiver's, not the entry's
ALTER TABLE delivery_destinations ADD COLUMN suspect_entry text NULL;

UPDATE delivery_queue SET destination = channel || ':' || recipient;
UPDATE delivery_queue SET receiver = destination WHERE channel NOT IN ('webhook', 'email');
UPDATE delivery_queue SET receiver = 'email:smtp' WHERE channel = 'email';

-- A webhook's receiver from its stored (canonical) URL: scheme://host[:port]/...
CREATE TEMP TABLE webhook_hosts_0028 AS
SELECT id, lower(substr(recipient, 1, instr(recipient, '://') - 1)) AS scheme,
       CASE WHEN instr(substr(recipient, instr(recipient, '://') + 3), '/') > 0
            THEN substr(substr(recipient, instr(recipient, '://') + 3), 1,
                        instr(substr(recipient, instr(recipient, '://') + 3), '/') - 1)
            ELSE substr(recipient, instr(recipient, '://') + 3) END AS hostport
FROM delivery_queue WHERE channel = 'webhook' AND instr(recipient, '://') > 0;
UPDATE delivery_queue
SET receiver = 'webhook:' || (
    SELECT CASE
        WHEN substr(h.hostport, 1, 1) = '[' AND instr(h.hostport, ']:') > 0
            THEN substr(h.hostport, 2, instr(h.hostport, ']:') - 2)
                 || substr(h.hostport, instr(h.hostport, ']:') + 1)
        WHEN substr(h.hostport, 1, 1) = '['
            THEN replace(replace(h.hostport, '[', ''), ']', '')
                 || CASE WHEN h.scheme = 'http' THEN ':80' ELSE ':443' END
        WHEN instr(h.hostport, ':') > 0 THEN h.hostport
        ELSE h.hostport || CASE WHEN h.scheme = 'http' THEN ':80' ELSE ':443' END END
    FROM webhook_hosts_0028 h WHERE h.id = delivery_queue.id)
WHERE id IN (SELECT id FROM webhook_hosts_0028);
UPDATE delivery_queue SET receiver = destination WHERE receiver IS NULL;
DROP TABLE webhook_hosts_0028;

-- No entry stays held by a failing or paused destination: the claim reads their state.
UPDATE delivery_queue SET held_by = NULL
WHERE held_by IS NOT NULL AND held_by NOT LIKE 'unconfigured:%';

DROP INDEX IF EXISTS delivery_queue_held_due_idx;
CREATE INDEX IF NOT EXISTS delivery_queue_receiver_due_idx
    ON delivery_queue (receiver, next_attempt_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS delivery_queue_receiver_idx ON delivery_queue (receiver, status);
