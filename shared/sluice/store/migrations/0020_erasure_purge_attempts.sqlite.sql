-- How many erasure-purge runs tried a request's purge and saw it raise (rolled back).
-- The request stays due, and the next run tries it again, until this reaches the bound
-- in sluice.erasure.purge (MAX_PURGE_ATTEMPTS); then it is failed, and that pages.
-- A store outage is not an attempt: it leaves the count alone.

ALTER TABLE data_erasure_requests ADD COLUMN purge_attempts integer NOT NULL DEFAULT 0;
