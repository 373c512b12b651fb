-- AI usage: the ledger (one row per model call, idempotent on the client-supplied id)
-- and the metering outbox that metering-flush drains to Polar. Public contract:
-- a TypeScript producer writes these tables too (see docs/billing.md).

CREATE TABLE IF NOT EXISTS ai_usage_ledger (
    id text PRIMARY KEY,
    tenant_id text NULL,
    user_id text NULL,
    model text NOT NULL,
    input_tokens integer NOT NULL DEFAULT 0,
    output_tokens integer NOT NULL DEFAULT 0,
    cost_micros bigint NOT NULL DEFAULT 0,
    occurred_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ai_usage_ledger_user_idx ON ai_usage_ledger (user_id);
CREATE INDEX IF NOT EXISTS ai_usage_ledger_tenant_idx ON ai_usage_ledger (tenant_id, occurred_at);

CREATE TABLE IF NOT EXISTS ai_usage_metering_outbox (
    id text PRIMARY KEY,
    ledger_id text NOT NULL,
    external_customer_id text NOT NULL,
    event_name text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processed', 'failed')),
    attempt_count integer NOT NULL DEFAULT 0,
    last_error text NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz NULL
);
-- Serves the eligibility query: pending, or failed with attempts left, oldest first.
CREATE INDEX IF NOT EXISTS ai_usage_metering_outbox_eligible_idx
    ON ai_usage_metering_outbox (created_at, id) WHERE status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS ai_usage_metering_outbox_ledger_idx
    ON ai_usage_metering_outbox (ledger_id);
CREATE INDEX IF NOT EXISTS ai_usage_metering_outbox_customer_idx
    ON ai_usage_metering_outbox (external_customer_id);
