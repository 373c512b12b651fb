"""Fixtures of the rss end-to-end tests: the local feed publisher."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers.feeds import FeedServer


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server
