// The JavaScript side of the signing contract: what a TypeScript producer computes.
// stdin: JSON array of {secret, text} where text is a message as JSON text.
// stdout: JSON array of {canonical, signature, valid} per message, where valid says
// whether the message's own "signature" field matches.
"use strict";
const crypto = require("crypto");

function canonical(msg) {
  const { signature, ...rest } = msg;
  return JSON.stringify(Object.entries(rest).sort());
}

const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = cases.map(({ secret, text }) => {
  const msg = JSON.parse(text);
  const input = canonical(msg);
  const signature = crypto.createHmac("sha256", secret).update(input, "utf8").digest("hex");
  const given = typeof msg.signature === "string" ? Buffer.from(msg.signature) : Buffer.alloc(0);
  const expected = Buffer.from(signature);
  const valid = given.length === expected.length && crypto.timingSafeEqual(given, expected);
  return { canonical: input, signature, valid };
});
process.stdout.write(JSON.stringify(out));
