"""A webhook receiver for Sluice's deliveries, on the Standard Webhooks library.

pip install standardwebhooks; run with WEBHOOK_SECRET=whsec_... (the standard form of a
secret in SLUICE_WEBHOOK_SIGNING_SECRET; during a rotation either one verifies).
Reads one request as JSON {"headers": {...}, "body": "..."} on stdin and prints
{"ok": true, "id": ..., "payload": ...} or {"ok": false, "status": 401}.
"""

import json
import os
import sys

from standardwebhooks import Webhook, WebhookVerificationError

seen: set[str] = set()  # a real receiver keeps the ids it acted on in its database


def receive(headers: dict[str, str], body: bytes) -> tuple[int, dict[str, object]]:
    try:
        payload = Webhook(os.environ["WEBHOOK_SECRET"]).verify(body, headers)
    except WebhookVerificationError:
        return 401, {"ok": False, "status": 401}
    msg_id = {k.lower(): v for k, v in headers.items()}["webhook-id"]
    duplicate = msg_id in seen  # the same id on every retry: act once
    seen.add(msg_id)
    return 200, {"ok": True, "id": msg_id, "duplicate": duplicate, "payload": payload}


if __name__ == "__main__":
    request = json.load(sys.stdin)
    status, answer = receive(request["headers"], request["body"].encode())
    print(json.dumps(answer))
