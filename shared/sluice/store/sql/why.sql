-- "Why is this waiting?" (shared/sluice/delivery/why.py): what the claim reads of an
-- entry beyond its own row and its destination's and receiver's state rows.

-- name: first_in_line
-- A failing receiver's probe: the claim takes one entry of it, the pending one due first
-- (claim's ORDER BY next_attempt_at, enqueued_at, id), once its probe is due.
SELECT id FROM delivery_queue
WHERE receiver = :receiver AND status = 'pending' AND next_attempt_at <= :now
  AND held_by IS NULL
ORDER BY next_attempt_at, enqueued_at, id
LIMIT 1
