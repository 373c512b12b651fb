"""Completed-message keys: what makes two messages one, and how long a completion is kept.

The topic in the key is out of the simulator's reach (its deployment has one topic,
``rss.ingest``), so it is pinned here; the retention is also judged there (a copy SQS
delivers again 30 hours late, ``queue_once``), and pinned here against serverless.yml.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from sluice.queues.keys import KEY_RETENTION, RedisCompletedKeys, dedupe_key
from sluice.queues.signing import canonical

ROOT = Path(__file__).resolve().parents[3]
MESSAGE = {"topic": "rss.ingest", "batchId": "b-1", "sourceId": "all-sources", "feedUrl": ""}


def test_a_dedupe_key_names_its_topic_so_one_content_on_two_topics_is_two_messages() -> None:
    payload = canonical(MESSAGE)
    first, second = dedupe_key("rss.ingest", payload), dedupe_key("app.ingest", payload)
    assert first != second
    assert re.fullmatch(r"rss\.ingest:[0-9a-f]{64}", first)
    assert second.startswith("app.ingest:")
    assert dedupe_key("rss.ingest", MESSAGE) == first  # the mapping and its bytes agree


def test_a_completion_is_kept_as_long_as_the_queue_keeps_a_copy() -> None:
    # serverless.yml's custom.queues.retention: a copy SQS delivers again may come any
    # time within it, and must still be answered as a duplicate
    found = re.search(r"^\s+retention:\s+(\d+)", (ROOT / "serverless.yml").read_text(),
                      re.MULTILINE)
    assert found is not None
    retention = timedelta(seconds=int(found.group(1)))
    assert KEY_RETENTION >= retention == timedelta(days=4)


class RecordingRedis:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], list[object]]] = []

    def eval(self, script: str, keys: list[str], args: list[object]) -> object:
        self.calls.append((script, keys, args))
        return len(keys)


def test_redis_completions_expire_after_the_whole_retention() -> None:
    redis = RecordingRedis()
    RedisCompletedKeys(redis).complete_many([("rss.ingest:ab", "rss.ingest", "m-1")])
    (_, keys, args), = redis.calls
    assert keys == ["queue:completed:rss.ingest:ab"]
    assert args[0] == int(KEY_RETENTION.total_seconds()) == 4 * 86400


def test_the_idempotency_key_counts_utf16_units_as_javascript_does() -> None:
    from sluice.queues.keys import js_prefix
    from sluice.queues.keys import reference_key as idempotency_key

    # "a😀b".slice(0, 2) is "a" and a lone high surrogate: "a_"; the whole is "a__b"
    assert js_prefix("a😀b", 2) == "a_" and js_prefix("a😀b") == "a__b"
    assert js_prefix("é-x" * 50) == "__x" * 32, "a BMP character is one unit"
    ascii_body = {"topic": "t.x", "batchId": "b", "feedUrl": "https://e.example/f"}
    key = idempotency_key(ascii_body)
    assert key == "t.x:b:" + js_prefix('{"topic":"t.x","batchId":"b","feedUrl":"https://e.example/f"}')
    tail = idempotency_key({"topic": "t.x", "batchId": "b", "s": "😀" * 100}).split(":", 2)[2]
    assert len(tail) == 96 and set(tail[33:]) == {"_"}  # 32 emoji: 64 units
