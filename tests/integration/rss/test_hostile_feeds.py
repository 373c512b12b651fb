"""Feeds inside every byte cap that would still cost a tick its memory and its deadline:
eight sources each serving a 4.9 MB Atom document of 150,000 tiny entries (before the
entry caps, such a tick peaked at 1,460 MB and ran 111 s against a 40 s build deadline),
beside a good feed in the same scope. The tick runs with the default settings in a fresh
interpreter, whose peak resident memory is read from the kernel (its ``VmHWM``); the oracle is
the kernel's figure, what the feed server served, and what the store recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from sluice.core.services import Services
from sluice.rss.catalog import peek_scope
from sluice.rss.store import RssStore
from tests.conftest import BASE_ENV, ROOT
from tests.providers.feeds import Feed, FeedServer
from tests.providers.hostile import HostilePeer
from tests.rss_support import FakeClock, catalog

HOSTILE_SOURCES = 8
ENTRIES = 150_000
DEFAULT_BUILD_DEADLINE_S = 40.0
PEAK_LIMIT_MB = 400


@cache
def tiny_entries_atom() -> bytes:
    head = (b'<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">'
            b"<title>many</title><id>urn:many</id><updated>2025-03-01T12:00:00Z</updated>")
    entries = b"".join(b"<entry><title>t%d</title></entry>" % (i % 100) for i in range(ENTRIES))
    return head + entries + b"</feed>"


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


# the CLI in this interpreter; as it exits, its peak in KiB goes to argv[1]: its own VmHWM,
# or the largest child it waited for if that was larger (a child's count starts from this
# interpreter's size when it forked, so it is bounded by the tick's own, not the worker's)
PEAK_WRAPPER = """
import atexit, resource, runpy, sys

def peak(path=sys.argv[1]):
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(path, "w") as out:
        out.write(str(max(kib, children)))

atexit.register(peak)
sys.argv = ["sluice", *sys.argv[2:]]
runpy.run_module("sluice.cli.main", run_name="__main__")
"""


def run_tick(env: dict[str, str], timeout: float, logs: Path) -> tuple[int, str, str, float,
                                                                      float]:
    """``sluice rss refresh --json`` in a fresh interpreter: its exit code, output and
    errors, its wall time and its peak resident memory in MB, children included. The peak
    is the kernel's ``VmHWM`` of the interpreter's own memory map, read as it exits (or a
    child's ``ru_maxrss`` when larger): ``ru_maxrss`` from
    ``wait4`` starts from the size of the test worker that spawned it (1,171 MB seen in
    CI for a tick whose own peak is a tenth of that)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    full_env.update(env)
    out, err, peak = logs / "stdout", logs / "stderr", logs / "peak-kib"
    started = time.monotonic()
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", PEAK_WRAPPER, str(peak), "rss",
                                 "refresh", "--json"], env=full_env, cwd=ROOT, stdout=stdout,
                                stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - started
    return (proc.returncode, out.read_text(), err.read_text(), elapsed,
            int(peak.read_text()) / 1024 if peak.exists() else float("inf"))


@pytest.mark.slow
def test_eight_feeds_of_150000_entries_stay_within_the_memory_and_the_deadline(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        tmp_path: Path) -> None:
    body = tiny_entries_atom()
    assert 4_800_000 < len(body) < 5_000_000, "inside the default 5 MB byte cap"
    svc = make_services(sqlite_url)
    store = RssStore(svc.db)
    hostile = []
    for n in range(HOSTILE_SOURCES):
        feeds.feeds[f"/many/{n}"] = Feed(body, "application/atom+xml")
        hostile.append(store.add_source(f"{feeds.url}/many/{n}", f"Many {n}").id)
    good = store.add_source(feeds.add_rss("/good", items=3), "Good").id
    store.put_scope("scope-hostile", "tenant-1", (*hostile, good), "en", True)

    # the defaults, but for the address guard's exemption of the local feed server
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_FEED_ALLOW_HOSTS": "127.0.0.1"}
    code, out, err, elapsed, peak_mb = run_tick(env, DEFAULT_BUILD_DEADLINE_S + 60, tmp_path)
    print(f"hostile tick: peak {peak_mb:.0f} MB, {elapsed:.1f} s")  # the README's figure

    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert peak_mb < PEAK_LIMIT_MB, f"peak {peak_mb:.0f} MB"
    assert elapsed < DEFAULT_BUILD_DEADLINE_S + 10, f"{elapsed:.1f} s"
    assert all(feeds.hits[f"/many/{n}"] == 1 for n in range(HOSTILE_SOURCES))
    assert result["tenantIngestion"]["refreshed"] == 1 and result["failed"] == 0, result
    assert result["catalog"]["feedsCut"] == HOSTILE_SOURCES, result["catalog"]
    for source in store.sources_by_ids(hostile):
        assert source.last_success_at is not None and source.consecutive_failures == 0
        assert source.last_error == ("cut: read the first 500 entries "
                                     "(SLUICE_RSS_MAX_FEED_ENTRIES is 500)"), source.last_error
    [good_source] = store.sources_by_ids((good,))
    assert good_source.last_error is None and good_source.last_success_at is not None
    assert peek_scope(svc, "scope-hostile") is not None
    assert sorted(row["title"] for row in store.stories_of((good,))) == [
        "good story 0", "good story 1", "good story 2"]


def test_no_fetch_or_parse_thread_outlives_its_build(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """A build whose deadline passes while hostile documents are still being parsed (eight
    of them, two at a time) and bodies trickle ends within a bounded grace, and leaves no
    worker of its own running."""
    deadline_s = 1.0
    svc = make_services(sqlite_url, SLUICE_FEED_ALLOW_HOSTS="127.0.0.1",
                        SLUICE_RSS_BUILD_DEADLINE_SECONDS=str(deadline_s))
    store = RssStore(svc.db)
    body = tiny_entries_atom()
    ids = []
    with HostilePeer(drip_s=0.05) as peer:
        for n in range(HOSTILE_SOURCES):
            feeds.feeds[f"/many/{n}"] = Feed(body, "application/atom+xml")
            ids.append(store.add_source(f"{feeds.url}/many/{n}").id)
        ids += [store.add_source(f"{peer.url}/trickle-body?{n}").id for n in range(2)]
        store.put_scope("scope-1", "tenant-1", tuple(ids), "en", True)
        before = {t.ident for t in threading.enumerate()}
        started = time.monotonic()
        with catalog(svc) as cat:
            refreshed = cat.refresh_scope("scope-1")
            elapsed = time.monotonic() - started
            left = [t.name for t in threading.enumerate()
                    if t.ident not in before and t.name.startswith("rss-fetch")]
    assert refreshed.outcome == "built"
    assert left == [], left
    assert elapsed < deadline_s + 5.0 + 3.0, f"{elapsed:.1f} s"  # the deadline, the grace, slack
    # each source: read in part, failed with its reason, or not started (skipped, not failed)
    for source in store.sources_by_ids(ids):
        cut = source.consecutive_failures == 0 and (source.last_error or "").startswith("cut:")
        failed = source.consecutive_failures == 1 and bool(source.last_error)
        assert cut or failed or source.last_fetched_at is None, source


def test_a_builds_entry_budget_cuts_then_skips_and_the_skipped_source_goes_first_next(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = make_services(sqlite_url, SLUICE_FEED_ALLOW_HOSTS="127.0.0.1",
                        SLUICE_RSS_MAX_FEED_ENTRIES="10", SLUICE_RSS_MAX_BUILD_ENTRIES="15",
                        SLUICE_RSS_FETCH_CONCURRENCY="1")
    store = RssStore(svc.db)
    ids = sorted(store.add_source(feeds.add_rss(f"/f/{n}", items=12)).id for n in range(3))
    store.put_scope("scope-1", "tenant-1", tuple(ids), "en", True)
    clock = FakeClock()
    with catalog(svc, clock) as cat:
        cat.refresh_scope("scope-1")
        counters = cat.counters
    first, second, third = store.sources_by_ids(ids)
    assert first.last_error == "cut: read the first 10 entries (SLUICE_RSS_MAX_FEED_ENTRIES is 10)"
    assert second.last_error == ("cut: read the first 5 entries "
                                 "(SLUICE_RSS_MAX_BUILD_ENTRIES is 15)")
    assert third.last_fetched_at is None and third.consecutive_failures == 0, "skipped"
    assert (counters.feeds_cut, counters.skipped) == (2, 1)
    assert len(store.stories_of(ids)) == 15

    clock.advance(3600)
    with catalog(svc, clock) as cat:
        cat.refresh_scope("scope-1")
    third = store.sources_by_ids((ids[2],))[0]
    assert third.last_error == "cut: read the first 10 entries (SLUICE_RSS_MAX_FEED_ENTRIES is 10)"
