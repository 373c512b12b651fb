"""Messages as each platform takes them: parts, chunking at the platform's limit with its
markup and escaping, and the addressing options mapped where the platform has them,
checked by stand-ins that refuse what the real APIs refuse."""

from __future__ import annotations

import re

import httpx

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from tests.integration.delivery.helpers import Providers, drain_once
from tests.providers.telegram import MAX_TEXT as TELEGRAM_MAX

PARAGRAPH = "Disk <sda1> & <sdb1> at 97 % on **db-1**; see `df -h`. " * 20  # ~1.1 k chars


def _long_text(paragraphs: int) -> str:
    return "\n\n".join(f"{i}: {PARAGRAPH.strip()}" for i in range(paragraphs))


def test_a_long_telegram_message_is_chunked_escaped_and_marked_up(
        svc: Services, providers: Providers) -> None:
    text = _long_text(8)  # ~9 k characters, with <, > and & throughout
    entry, _ = DeliveryStore(svc.db).enqueue(
        "telegram", "1001", {"payloads": [text, "second part"], "silent": True,
                             "threadId": "42", "replyToId": "7"})

    result = drain_once(svc)

    assert result["recovered"] == 1 and result["failed"] == 0
    messages = providers.telegram.messages
    assert len(messages) >= 4, "over 4096 characters: split, and each part sent on its own"
    assert all(len(m["text"]) <= TELEGRAM_MAX and m["parse_mode"] == "HTML" for m in messages)
    assert "&lt;sda1&gt; &amp;" in messages[0]["raw"] and "<b>db-1</b>" in messages[0]["raw"]
    assert "<code>df -h</code>" in messages[0]["raw"]
    visible = "\n\n".join(m["text"] for m in messages[:-1])
    assert visible == re.sub(r"\*\*|`", "", text), "split on paragraphs, nothing lost"
    assert messages[-1]["text"] == "second part"
    assert all(m["silent"] and m["thread_id"] == 42 for m in messages)
    assert [m["reply_to"] for m in messages] == [7] + [None] * (len(messages) - 1)
    stored = DeliveryStore(svc.db).get(entry.id)
    assert stored.platform_message_id == ",".join(str(m["message_id"]) for m in messages)


def test_one_paragraph_longer_than_the_limit_splits_on_lines_then_words(
        svc: Services, providers: Providers) -> None:
    line = "word " * 300  # 1,500 characters, no newline
    text = "\n".join([line.strip()] * 4) + "\n" + "x" * 5000  # then one 5,000-character word
    DeliveryStore(svc.db).enqueue("telegram", "1001", {"text": text})

    assert drain_once(svc)["recovered"] == 1

    sent = [m["text"] for m in providers.telegram.messages]
    assert all(len(t) <= TELEGRAM_MAX for t in sent)
    assert sent[0] == "\n".join([line.strip()] * 2), "whole lines, as many as fit"
    assert "".join(sent).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(
        " ", ""), "every character once, in order"


def test_slack_gets_mrkdwn_chunks_in_a_thread(svc: Services, providers: Providers) -> None:
    text = _long_text(6)
    DeliveryStore(svc.db).enqueue("slack", "C0ALERTS", {
        "payloads": [text], "threadId": "1699999999.000100", "silent": True,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Disk alert*"}}]})

    assert drain_once(svc)["recovered"] == 1

    messages = providers.slack.messages
    assert len(messages) >= 2 and all(len(m["text"]) <= 4000 for m in messages)
    assert all(m["thread_ts"] == "1699999999.000100" for m in messages)
    assert "&lt;sda1&gt; &amp; &lt;sdb1&gt;" in messages[0]["text"]
    assert "*db-1*" in messages[0]["text"] and "**" not in messages[0]["text"]
    assert ["blocks" in m for m in messages] == [True] + [False] * (len(messages) - 1)


def test_too_many_slack_blocks_are_refused_at_enqueue_not_at_send(svc: Services) -> None:
    from sluice.core.errors import RequestError
    from sluice.delivery.drain import check_enqueue

    blocks = [{"type": "divider"}] * 51
    try:
        check_enqueue("slack", {"text": "x", "blocks": blocks})
    except RequestError as exc:
        assert exc.context == {"field": "blocks"}
    else:
        raise AssertionError("51 blocks were accepted")


def test_email_joins_the_parts_and_threads_by_message_id(svc: Services,
                                                         providers: Providers) -> None:
    DeliveryStore(svc.db).enqueue("email", "ops@example.com", {
        "subject": "Disk", "payloads": ["**db-1** is full", "a < b & c"],
        "replyToId": "<first@sluice.test>", "threadId": "<root@sluice.test>"})

    assert drain_once(svc)["recovered"] == 1

    [mail] = providers.smtp.messages
    assert mail["In-Reply-To"] == "<first@sluice.test>"
    assert mail["References"] == "<root@sluice.test> <first@sluice.test>"
    plain, html = (part.get_payload(decode=True).decode() for part in mail.get_payload())
    assert plain.replace("\r\n", "\n").strip() == "db-1 is full\n\na < b & c"
    assert "<p><b>db-1</b> is full</p>" in html and "<p>a &lt; b &amp; c</p>" in html


def test_the_telegram_stand_in_refuses_what_telegram_refuses(providers: Providers) -> None:
    url = f"{providers.telegram.url}/bot{providers.telegram.token}/sendMessage"
    with httpx.Client(timeout=5) as client:
        def send(text: str, **extra: object) -> httpx.Response:
            return client.post(url, json={"chat_id": "1001", "text": text, **extra})

        unescaped = send("disk <sda1> & more", parse_mode="HTML")
        unclosed = send("<b>bold", parse_mode="HTML")
        too_long = send("x" * (TELEGRAM_MAX + 1))
        escaped = send("&lt;" * TELEGRAM_MAX, parse_mode="HTML")
    assert unescaped.status_code == 400
    assert "can't parse entities" in unescaped.json()["description"]
    assert unclosed.status_code == 400 and "end tag" in unclosed.json()["description"]
    assert too_long.json() == {"ok": False, "error_code": 400,
                               "description": "Bad Request: message is too long"}
    assert escaped.status_code == 200, "the limit counts text after entity parsing"
