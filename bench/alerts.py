"""The alert sweep: 1,000 tenants x 20 rules over 10 cached builds (60 stories each), on
SQLite in a temporary directory (no network: builds are stored directly, and the sweep
never fetches).

Sluice's sweep (``sluice.alerts.sweep.run_alert_sweep``: batches of 5 threads, each build
read once per sweep through ``peek_scope`` and its stories normalised once) against a
naive sweep that re-reads the tenant's build for every tenant and normalises each story
for every rule. Both run the same matcher and enqueue the same matches (one rule per
tenant matches one story); the sweeps measured are re-runs, as every tick after the
first is, so each match meets its stored idempotency key. The naive sweep is timed on
the first ``NAIVE_TENANTS`` tenants (a rate, so comparable) to stay under a minute.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta
from typing import Any

from bench.common import Row, row

TENANTS = int(os.environ.get("SLUICE_BENCH_ALERTS_TENANTS", "1000"))
RULES = 20
BUILDS = 10
STORIES = 60
NAIVE_TENANTS = int(os.environ.get("SLUICE_BENCH_ALERTS_NAIVE_TENANTS", "100"))
WORDS = ("élection", "marché", "énergie", "santé", "climat", "économie", "sécurité",
         "transport", "éducation", "numérique", "culture", "sport", "industrie", "données")


def _services(directory: str) -> Any:
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.store.db import open_database
    from sluice.store.migrate import migrate

    url = f"sqlite:///{directory}/bench.db"
    migrate(open_database(url))
    return Services.from_settings(Settings.from_env({"SLUICE_DATABASE_URL": url}))


def _seed(services: Any) -> list[str]:
    from sluice.alerts.rules import RulesStore
    from sluice.rss.store import CatalogBuild, RssStore, Story
    from sluice.store.db import utcnow

    store = RssStore(services.db)
    now = utcnow()
    sets = []
    for b in range(BUILDS):
        source = store.add_source(f"http://127.0.0.1:9/feed-{b}.xml", f"feed {b}").id
        sets.append((source,))
        stories = tuple(
            Story(id=f"b{b}-s{s}", title=f"Dépêche {s} du fil {b}: {WORDS[(b + s) % 14]}",
                  link=f"https://news.example/{b}/{s}", published_at=now - timedelta(minutes=s),
                  summary="<p>" + " ".join(WORDS[(s * 3 + w) % 14] for w in range(40)) + "</p>",
                  source_id=source)
            for s in range(STORIES))
        scope = store.put_scope(f"probe-{b}", "probe", (source,), "en", True)
        store.save_build(CatalogBuild(key=scope.build_key, source_ids=(source,), locale="en",
                                      built_at=now, stories=stories), timedelta(hours=1))
        store.remove_scope(f"probe-{b}")
    rules_store = RulesStore(services)
    scope_ids = [f"tenant-{n:04d}" for n in range(TENANTS)]
    for n, scope_id in enumerate(scope_ids):
        store.put_scope(scope_id, f"org-{n}", sets[n % BUILDS], "en", True)
        rules = [{"id": f"r{r}", "match": {"keywords": [f"absent{r}x{n}", f"nowhere {r}"]},
                  "destination": {"channel": "slack", "recipient": f"C{n:05d}"}}
                 for r in range(RULES - 1)]
        rules.append({"id": "hit", "match": {"keywords": [f"depeche {n % STORIES} du fil"]},
                      "destination": {"channel": "slack", "recipient": f"C{n:05d}"}})
        rules_store.put(scope_id, rules)
    return scope_ids


def _naive_sweep(services: Any, scope_ids: list[str]) -> int:
    """Per tenant: read its build and parse its rules, then per rule normalise and test
    every story (Sluice's caches of parsed rules and normalised texts are not used: they
    are part of what is measured)."""
    from sluice.alerts.evaluate import match_key, payload
    from sluice.alerts.rules import Matcher, normalise, parse_rule, rules_key
    from sluice.delivery.store import DeliveryStore
    from sluice.rss.catalog import peek_scope
    from sluice.store.state import StateStore

    state, deliveries = StateStore(services.db), DeliveryStore(services.db)
    evaluations = 0
    for scope_id in scope_ids:
        build = peek_scope(services, scope_id)
        assert build is not None
        stored = state.get(rules_key(scope_id)) or {}
        for n, item in enumerate(stored.get("rules") or []):
            rule = parse_rule(item, f"rules[{n}]", None)
            matcher = Matcher(rule)
            for story in build.stories:
                evaluations += 1
                if matcher.matches(story, normalise(f"{story.title} {story.summary}")):
                    deliveries.enqueue(rule.destination.channel, rule.destination.recipient,
                                       payload(scope_id, rule, story),
                                       idempotency_key=match_key(scope_id, rule.id, story.id))
    return evaluations


def run() -> list[Row]:
    from sluice.alerts.sweep import run_alert_sweep
    from sluice.delivery.store import DeliveryStore
    from sluice.jobs.registry import Deadline

    with tempfile.TemporaryDirectory(prefix="sluice-bench-alerts-") as directory:
        services = _services(directory)
        try:
            scope_ids = _seed(services)
            first = run_alert_sweep(services, Deadline(600))
            assert first["enqueued"] == TENANTS, first
            started = time.perf_counter()
            again = run_alert_sweep(services, Deadline(600))
            sluice_s = time.perf_counter() - started
            assert again["evaluated"] == TENANTS and again["enqueued"] == 0, again
            started = time.perf_counter()
            naive_evaluations = _naive_sweep(services, scope_ids[:NAIVE_TENANTS])
            naive_s = time.perf_counter() - started
            assert len(DeliveryStore(services.db).list(limit=500)) > 0
        finally:
            services.close()
    ours = again["evaluations"] / sluice_s
    naive = naive_evaluations / naive_s
    return [
        row("alert sweep: evaluations/s", ours, naive, "(rule, story)/s", True,
            note=f"{TENANTS} tenants x {RULES} rules over {BUILDS} builds of {STORIES} "
                 f"stories; naive on {NAIVE_TENANTS} tenants"),
        row("alert sweep: wall time (re-run)", sluice_s,
            naive_s * TENANTS / max(NAIVE_TENANTS, 1), "s", False,
            note="naive extrapolated from its rate"),
    ]
