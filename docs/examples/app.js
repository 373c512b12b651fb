// @ts-check
// How a TypeScript (or JavaScript) web app feeds Sluice. Plain JavaScript typed with JSDoc
// (`// @ts-check`), so a TypeScript project can type-check its use of it; Node runs it as is
// (the test suite does, with no compiler).
// It needs nothing but Node's standard library: the SQS, Postgres and Redis clients are the
// app's own (@aws-sdk/client-sqs, pg, ioredis…) and are passed in, so this file shows the
// exact bytes each one must send. See docs/integration.md.
"use strict";

const crypto = require("crypto");

/** @typedef {{[key: string]: unknown}} Message */

/**
 * The signing input: every field but `signature`, as the key-sorted list of [key, value]
 * pairs, compact JSON. Sluice's Python signer produces the same bytes.
 * @param {Message} message
 * @returns {string}
 */
function canonical(message) {
  const { signature, ...rest } = message;
  return JSON.stringify(Object.entries(rest).sort());
}

/**
 * The message with its `signature` (HMAC-SHA256 of the signing input, hex). Sign with the
 * first of SLUICE_QUEUE_SIGNING_SECRETS; Sluice accepts any configured secret.
 * @param {Message} message
 * @param {string} secret
 * @returns {Message}
 */
function sign(message, secret) {
  const signature = crypto.createHmac("sha256", secret).update(canonical(message), "utf8")
    .digest("hex");
  return { ...message, signature };
}

/**
 * A message for `topic` as Sluice's publisher builds it: `topic`, the topic's own fields,
 * then the signature. `rss.ingest` (Sluice's rss pack) leads with its reference fields,
 * filled when not given: `batchId`, `sourceId`, `feedUrl`, `publishedAt`. Any other
 * topic's message is its fields as given, which must be the ones the topic declares
 * (`Topic.fields` in the app's extension module, docs/extending.md).
 * @param {string} topic
 * @param {Message} fields
 * @param {string} secret
 * @param {Date} [now]
 * @returns {Message}
 */
function buildMessage(topic, fields, secret, now = new Date()) {
  /** @type {Message} */
  const message = { topic };
  if (topic === "rss.ingest") {
    message.batchId = fields.batchId ?? crypto.randomUUID();
    message.sourceId = fields.sourceId ?? "all-sources";
    message.feedUrl = fields.feedUrl ?? "";
    message.publishedAt = fields.publishedAt ?? now.toISOString();
  }
  for (const [key, value] of Object.entries(fields)) {
    if (!(key in message) && key !== "topic" && key !== "signature") message[key] = value;
  }
  return sign(message, secret);
}

/**
 * The `idempotencyKey` message attribute, made as the message's topic declares
 * (`Topic.key`). `rss.ingest`: `<topic>:<batchId>:<first 96 UTF-16 units of the unsigned
 * message's JSON, each non-alphanumeric as _>`. A topic keyed by fields (pass their names
 * as `keyFields`): `<topic>:<value>:...`, a string as it is, anything else as JSON. Any
 * other: `<topic>:<hex SHA-256 of the signing input>`.
 * @param {Message} message
 * @param {string[]} [keyFields]
 * @returns {string}
 */
function idempotencyKey(message, keyFields = []) {
  if (message.topic === "rss.ingest") {
    const { signature, ...body } = message;
    const head = JSON.stringify(body).slice(0, 96);
    return `${message.topic}:${message.batchId}:${head.replace(/[^A-Za-z0-9]/g, "_")}`;
  }
  if (keyFields.length) {
    const parts = keyFields.map((name) => {
      const value = message[name];
      return typeof value === "string" ? value : JSON.stringify(value);
    });
    return [message.topic, ...parts].join(":");
  }
  const hash = crypto.createHash("sha256").update(canonical(message), "utf8").digest("hex");
  return `${message.topic}:${hash}`;
}

/**
 * The input of SQS SendMessage for a signed message, for
 * `sqs.send(new SendMessageCommand(sendMessageInput(url, message)))`. The queue URL is
 * `<SLUICE_QUEUE_PREFIX><topic with . as ->` in your account (see docs/queues.md).
 * @param {string} queueUrl
 * @param {Message} message
 * @param {string[]} [keyFields]  the fields its topic is keyed by (see idempotencyKey)
 */
function sendMessageInput(queueUrl, message, keyFields = []) {
  return {
    QueueUrl: queueUrl,
    MessageBody: JSON.stringify(message),
    MessageAttributes: {
      idempotencyKey: { DataType: "String", StringValue: idempotencyKey(message, keyFields) },
    },
  };
}

/**
 * @typedef {object} UsageEntry
 * @property {string} id          the app's stable id for the model call (idempotency key)
 * @property {string|null} tenantId
 * @property {string|null} userId
 * @property {string} model
 * @property {number} inputTokens
 * @property {number} outputTokens
 * @property {number} costMicros
 * @property {string} occurredAt  ISO-8601 UTC
 */

/** @typedef {"postgres" | "sqlite"} Dialect */

/**
 * A time as Sluice's SQLite store writes it (`YYYY-MM-DD HH:MM:SS.ffffff+00:00`, UTC), so
 * text order stays time order; Postgres takes the ISO string as it is.
 * @param {string | Date} time
 */
function sqliteTime(time) {
  return new Date(time).toISOString().replace("T", " ").replace("Z", "000+00:00");
}

/**
 * The statements that write one usage entry, to run in one transaction in order (`pg`:
 * `client.query(text, values)`, `$n` parameters; SQLite drivers such as better-sqlite3:
 * `db.prepare(text).run(...values)`, `?` parameters): the ledger row and, when billable
 * (a customer, the tenant else the user, and some usage), its metering outbox row; an id
 * already written and a user who was erased write nothing. One statement on Postgres; two
 * on SQLite (its statements write one table each), the second writing the outbox row only
 * when the first inserted the ledger row.
 * @param {UsageEntry} e
 * @param {Dialect} [dialect]
 * @returns {{text: string, values: unknown[]}[]}
 */
function usageStatements(e, dialect = "postgres") {
  if (dialect === "sqlite") {
    const ledger = `
INSERT INTO ai_usage_ledger
  (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at)
SELECT ?, ?, ?, ?, ?, ?, ?, ?
WHERE NOT EXISTS (SELECT 1 FROM erasure_tombstones WHERE subject_user_id = ?)
ON CONFLICT (id) DO NOTHING`;
    const outbox = `
INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, event_name, metadata)
SELECT l.id || ':metering', l.id, l.customer, 'ai_usage',
       json_object('model', l.model, 'input_tokens', l.input_tokens,
                   'output_tokens', l.output_tokens,
                   'total_tokens', l.input_tokens + l.output_tokens,
                   'cost_micros', l.cost_micros, 'ledger_id', l.id)
FROM (SELECT id, coalesce(nullif(tenant_id, ''), nullif(user_id, '')) AS customer, model,
             input_tokens, output_tokens, cost_micros
      FROM ai_usage_ledger WHERE id = ?) AS l
WHERE changes() = 1
  AND l.customer IS NOT NULL
  AND (l.input_tokens <> 0 OR l.output_tokens <> 0 OR l.cost_micros <> 0)
  AND NOT EXISTS (SELECT 1 FROM erasure_tombstones WHERE subject_user_id = l.customer)
ON CONFLICT (id) DO NOTHING`;
    return [
      { text: ledger, values: [e.id, e.tenantId, e.userId, e.model, e.inputTokens,
        e.outputTokens, e.costMicros, sqliteTime(e.occurredAt), e.userId] },
      { text: outbox, values: [e.id] },
    ];
  }
  const text = `
WITH gone AS (
  SELECT subject_user_id AS subject FROM erasure_tombstones
  WHERE subject_user_id IN ($2::text, $3::text)
), ledger AS (
  INSERT INTO ai_usage_ledger
    (id, tenant_id, user_id, model, input_tokens, output_tokens, cost_micros, occurred_at)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::integer, $6::integer, $7::bigint,
         $8::timestamptz
  WHERE NOT EXISTS (SELECT 1 FROM gone WHERE subject = $3::text)
  ON CONFLICT (id) DO NOTHING
  RETURNING id, coalesce(nullif(tenant_id, ''), nullif(user_id, '')) AS customer, model,
            input_tokens, output_tokens, cost_micros
)
INSERT INTO ai_usage_metering_outbox (id, ledger_id, external_customer_id, event_name, metadata)
SELECT l.id || ':metering', l.id, l.customer, 'ai_usage',
       jsonb_build_object('model', l.model, 'input_tokens', l.input_tokens,
                          'output_tokens', l.output_tokens,
                          'total_tokens', l.input_tokens + l.output_tokens,
                          'cost_micros', l.cost_micros, 'ledger_id', l.id)
FROM ledger l
WHERE l.customer IS NOT NULL
  AND (l.input_tokens <> 0 OR l.output_tokens <> 0 OR l.cost_micros <> 0)
  AND NOT EXISTS (SELECT 1 FROM gone WHERE subject = l.customer)
ON CONFLICT (id) DO NOTHING`;
  return [{ text, values: [e.id, e.tenantId, e.userId, e.model, e.inputTokens, e.outputTokens,
    e.costMicros, e.occurredAt] }];
}

/**
 * The Postgres statement of `usageStatements` (the only one there).
 * @param {UsageEntry} e
 * @returns {{text: string, values: unknown[]}}
 */
function usageStatement(e) {
  return usageStatements(e, "postgres")[0];
}

/**
 * The Redis retry entry for a usage entry Postgres could not take (connection refused or
 * timed out, never a constraint error): `LPUSH <SLUICE_REDIS_KEY_PREFIX>ai:ledger:retry:queue`
 * this string, and ledger-redrive writes it later with every check above.
 * @param {UsageEntry} entry
 * @param {string} lastError
 * @param {Date} [now]
 * @returns {string}
 */
function retryEnvelope(entry, lastError, now = new Date()) {
  return JSON.stringify({ id: entry.id, attempts: 0, enqueuedAt: now.toISOString(),
    lastError, entry });
}

/**
 * A delivery entry, stored `pending` and due now; delivery-drain sends it. A key already
 * stored inserts nothing (the first entry stands). `$n` parameters for `pg`, `?` for SQLite.
 * @param {{channel: string, recipient: string, payload: object, idempotencyKey?: string,
 *          subjectUserId?: string}} d
 * @param {Date} [now]
 * @param {Dialect} [dialect]
 * @returns {{text: string, values: unknown[]}}
 */
function deliveryStatement(d, now = new Date(), dialect = "postgres") {
  const sqlite = dialect === "sqlite";
  const at = sqlite ? sqliteTime(now) : now.toISOString();
  const p = sqlite ? ["?", "?", "?", "?", "?", "?", "?", "?", "?"]
    : ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$7", "$7"];
  const text = `
INSERT INTO delivery_queue
  (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
   next_attempt_at, lease_until, enqueued_at, updated_at)
VALUES (${p[0]}, ${p[1]}, ${p[2]}, ${p[3]}, ${p[4]}, ${p[5]}, 'pending', 0, ${p[6]}, NULL, ${p[7]},
        ${p[8]})
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING`;
  const values = [crypto.randomUUID(), d.channel, d.recipient, d.subjectUserId ?? null,
    JSON.stringify(d.payload), d.idempotencyKey ?? null, at];
  return { text, values: sqlite ? [...values, at, at] : values };
}

/**
 * Push a signed message to `sluice dev`'s route for its topic (`/api/queues/rss/ingest` for
 * `rss.ingest`), which runs the topic's consumer as the queue would: try a producer end to
 * end without AWS. Answers the HTTP status and what the consumer did (`outcome`: done,
 * duplicate, rejected when forged, dead_lettered; a 503 means its store is down).
 * @param {string} baseUrl   e.g. http://127.0.0.1:8787
 * @param {Message} message  from buildMessage
 * @param {typeof fetch} [fetchImpl]
 * @returns {Promise<{status: number, body: any}>}
 */
async function pushMessage(baseUrl, message, fetchImpl = fetch) {
  const route = String(message.topic).split(".").join("/");
  const response = await fetchImpl(`${baseUrl}/api/queues/${route}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(message),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: response.status, body: await response.json() };
}

/**
 * Open an erasure request through Sluice's API (an admin token with the privacy role;
 * `POST /api/admin/erasure/requests`). Answers the request, or the subject's open one.
 * @param {string} baseUrl   e.g. https://sluice.example.com
 * @param {string} token     a JWT your identity provider issues (verified against the JWKS)
 * @param {string} subjectUserId
 * @param {typeof fetch} [fetchImpl]
 */
async function requestErasure(baseUrl, token, subjectUserId, fetchImpl = fetch) {
  const response = await fetchImpl(`${baseUrl}/api/admin/erasure/requests`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ subjectUserId }),
    signal: AbortSignal.timeout(10_000),
  });
  const body = await response.json();
  if (!response.ok) throw new Error(`erasure request refused: ${response.status} ${JSON.stringify(body)}`);
  return body;
}

module.exports = { canonical, sign, buildMessage, idempotencyKey, sendMessageInput,
  usageStatements, usageStatement, retryEnvelope, deliveryStatement, pushMessage,
  requestErasure, sqliteTime };
