"""A story's link and a title that falls back to it are stored and served as plain text, from
both readers (plain RSS 2.0 and feedparser's Atom), through the tick and the stories route:
the characters a URL may not hold raw (``<``, ``>``, ``"``, a space, ...) are percent-encoded,
so an app that renders a title or puts a link in an attribute renders no tag."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from tests.conftest import CRON_SECRET, admin_token
from tests.providers.feeds import Feed, FeedServer
from tests.rss_support import FEED_ENV

BASE = "/api/admin/rss"
# as the documents carry them, XML-escaped: the links are these once the XML is read
SCRIPT = "https://feed.test/&lt;script&gt;alert(1)&lt;/script&gt;"
QUOTE = "https://feed.test/a&quot;onmouseover=&quot;x y"
SERVED = {"https://feed.test/%3Cscript%3Ealert(1)%3C/script%3E",
          "https://feed.test/a%22onmouseover=%22x%20y"}
RSS = (f'<rss version="2.0"><channel><title>x</title>'
       f"<item><title>&lt;b&gt;&lt;/b&gt;</title><link>{SCRIPT}</link></item>"
       f"<item><link>{QUOTE}</link></item></channel></rss>").encode()
ATOM = (f'<feed xmlns="http://www.w3.org/2005/Atom"><title>x</title><id>urn:x</id>'
        f'<updated>2025-03-01T12:00:00Z</updated>'
        f'<entry><title type="html">&lt;i&gt;&lt;/i&gt;</title><link href="{SCRIPT}"/>'
        f'<id>urn:1</id><updated>2025-03-01T12:00:00Z</updated></entry>'
        f'<entry><title></title><link href="{QUOTE}"/><id>urn:2</id>'
        f'<updated>2025-03-01T12:01:00Z</updated></entry></feed>').encode()


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.mark.parametrize("document", [RSS, ATOM], ids=["rss", "atom"])
def test_a_title_that_falls_back_to_its_link_and_the_link_are_plain_text(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        document: bytes) -> None:
    client = TestClient(create_app(make_services(db_url, **FEED_ENV)),
                        raise_server_exceptions=False)
    feeds.feeds["/x"] = Feed(document)
    source = client.post(f"{BASE}/sources", json={"url": f"{feeds.url}/x"},
                         headers=ops()).json()
    client.put(f"{BASE}/scopes/links", headers=ops(), json={
        "tenantId": "acme", "sourceIds": [source["id"]], "locale": "en"})
    tick = client.get("/api/admin/rss/refresh", headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert tick.status_code == 200, tick.text

    stories = client.get(f"{BASE}/scopes/links/stories", headers=ops()).json()["stories"]

    assert {s["link"] for s in stories} == SERVED
    assert {s["title"] for s in stories} == SERVED, "the title fell back to the link"
    for story in stories:
        assert not set('<>" ') & set(story["title"] + story["link"]), story
