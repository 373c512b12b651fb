"""The ``slack`` channel: ``chat.postMessage`` with a bot token; the recipient is a channel id.

Each part is converted to mrkdwn (``&``, ``<``, ``>`` escaped; ``**bold**`` -> ``*bold*``)
and split into messages of at most ``SLACK_MAX_TEXT`` characters; ``blocks`` go with
the first message. ``threadId`` (else ``replyToId``) becomes ``thread_ts``;
``accountId`` and ``silent`` have no Slack equivalent and are ignored. Slack answers
HTTP 200 with ``{"ok": false, "error": "channel_not_found"}`` for most errors and 429
with ``Retry-After`` when rate limited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.delivery.channels.base import (
    NO_PROGRESS,
    ChannelAdapter,
    Outbound,
    Progress,
    json_of,
    message_of,
    refused,
    send_chunks,
    transient,
    transport_error,
)
from sluice.delivery.chunking import SLACK_MAX_TEXT, chunk, to_slack_mrkdwn
from sluice.delivery.classify import TransientDeliveryError
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.egress import Egress, EgressError
from sluice.egress.pacing import DEFAULT_CAP_S, seconds_header

if TYPE_CHECKING:
    from sluice.core.settings import Settings


class SlackAdapter:
    name = "slack"

    def __init__(self, client: Egress, token: str,
                 base_url: str = "https://slack.com/api", retrier: Retrier | None = None, *,
                 pacing_cap_s: float = DEFAULT_CAP_S) -> None:
        self.client = client
        self.token = token
        self.base_url = base_url.rstrip("/")
        self.retrier = retrier or Retrier()
        self.pacing_cap_s = pacing_cap_s

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        message = message_of(entry)
        texts = [c for part in message.parts for c in chunk(part, SLACK_MAX_TEXT, to_slack_mrkdwn)]
        bodies: list[dict[str, Any]] = []
        for text in texts or [""]:
            body: dict[str, Any] = {"channel": entry.recipient, "text": text, "mrkdwn": True}
            if message.thread_id or message.reply_to_id:
                body["thread_ts"] = message.thread_id or message.reply_to_id
            bodies.append(body)
        if message.blocks:
            bodies[0]["blocks"] = list(message.blocks)
        return send_chunks(bodies, self._post, retrier=self.retrier, label=f"slack {entry.id}",
                           best_effort=message.best_effort, progress=progress)

    def _post(self, body: dict[str, Any]) -> str:
        try:
            response = self.client.request(
                "POST", f"{self.base_url}/chat.postMessage", json=body,
                headers={"authorization": f"Bearer {self.token}"})
        except EgressError as exc:
            raise transport_error("slack", exc, redact=self.token) from None
        data = json_of(response)
        if response.status == 429:
            raise transient("slack: rate_limited", status=429, pacing=seconds_header(
                response.headers.get("retry-after"), cap_s=self.pacing_cap_s))
        if response.status >= 500 or not data:
            raise TransientDeliveryError(f"slack answered {response.status}")
        if data.get("ok") is True:
            return f"{data.get('channel', body['channel'])}:{data.get('ts')}"
        # Slack's 4xx-like answers (invalid_auth, …) come as 200s: only the patterns decide.
        raise refused(f"slack: {data.get('error', 'unknown_error')}")


def build(settings: Settings, client: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    if not settings.slack_bot_token:
        return None
    return SlackAdapter(client.providers, settings.slack_bot_token, settings.slack_api_url, retrier,
                        pacing_cap_s=settings.delivery_pacing_cap_s)
