// A webhook receiver for Sluice's deliveries in plain Node.js (no package): the Standard
// Webhooks check, as the `standardwebhooks` npm package does it.
// WEBHOOK_SECRET=whsec_... ; reads {"headers": {...}, "body": "..."} on stdin, prints the verdict.
'use strict';
const crypto = require('crypto');

const TOLERANCE_S = 300;

function verify(secret, headers, body, nowS = Math.floor(Date.now() / 1000)) {
  const h = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
  const id = h['webhook-id'];
  const timestamp = h['webhook-timestamp'];
  const signatures = (h['webhook-signature'] || '').split(' ');
  if (!id || !/^\d{1,12}$/.test(timestamp || '')) return false;
  if (Math.abs(nowS - Number(timestamp)) > TOLERANCE_S) return false;
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const expected = crypto.createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest();
  return signatures.some((entry) => {
    const [version, signature] = entry.split(',');
    const given = Buffer.from(signature || '', 'base64');
    return version === 'v1' && given.length === expected.length
      && crypto.timingSafeEqual(given, expected);
  });
}

module.exports = { verify };

if (require.main === module) {
  const request = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const ok = verify(process.env.WEBHOOK_SECRET, request.headers, request.body);
  console.log(JSON.stringify(ok ? { ok, id: request.headers['webhook-id'] } : { ok, status: 401 }));
}
