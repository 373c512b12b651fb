-- A replay by destination and window (shared/sluice/delivery/replay.py) pages through the
-- settled entries enqueued in its window, oldest first, 500 a statement: this index keeps
-- each page a range read, however many entries the retention holds outside the window.
CREATE INDEX IF NOT EXISTS delivery_queue_window_idx
    ON delivery_queue (enqueued_at, id)
    WHERE status IN ('acked', 'failed', 'unknown');
