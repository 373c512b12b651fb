"""The delivery queue past one sender: 20,000 entries to 500 Telegram chats and 20
webhook hosts, on Postgres, drained by 1, 4 and 8 concurrent senders, each its own
process with its own connection pool and HTTP client (as separate functions would be)
and the real drain with ``SLUICE_DELIVERY_DRAIN_CONCURRENCY`` sends in flight (12 in all,
split between the senders, at least 2 each).

The shared rates are held in Redis. The stand-ins enforce the providers' limits
(Telegram: 30 a second per bot, 1 a second per chat; each webhook host: 10 a second,
Sluice's default) over sliding windows and answer 429 with ``retry_after`` beyond them;
Sluice runs with the same limits as its settings (and its default 5% headroom below
them). The entries are split between the channels in proportion to what the limits
allow, so both finish together at best; the baseline is that rate (the whole queue at
exactly the limits, headroom not deducted). Reported per sender count: delivered per
second against it (target: at least 0.9), with the 429s received, duplicates, lost
entries and attempts burned by 429s in the note (the last three must be 0).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
import uuid
from typing import Any, NamedTuple

from bench.common import Row, row
from bench.scale.pg import scratch_url

ENTRIES = int(os.environ.get("SLUICE_BENCH_SCALE_DELIVERY_ENTRIES", "20000"))
CHATS = 500
HOSTS = 20
SENDERS = tuple(int(c) for c in os.environ.get("SLUICE_BENCH_SCALE_DELIVERY_SENDERS",
                                                "1,4,8").split(","))
# Sends in flight across all senders (each sender's SLUICE_DELIVERY_DRAIN_CONCURRENCY is
# its share, at least 2): the rates allow the same total whatever the number of senders,
# and more in flight than that only makes workers wait for slots.
IN_FLIGHT = int(os.environ.get("SLUICE_BENCH_SCALE_DELIVERY_IN_FLIGHT", "12"))
BOT_RATE, CHAT_RATE, HOST_RATE = 30, 1, 10
REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TOKEN = "4242:bench-scale-token"
SECRET = "bench-scale-webhook-secret-0123456789"


class Run(NamedTuple):
    wall_s: float
    delivered: int
    refused: int
    duplicates: int
    lost: int  # acknowledged by Sluice but never accepted by the provider
    burned: int


def concurrency(senders: int) -> int:
    return max(2, math.ceil(IN_FLIGHT / senders))


def _env(url: str, telegram_url: str, senders: int) -> dict[str, str]:
    # the shared rates in Redis (one round trip a send), as a deployment that scales out
    # would configure; the queue itself on Postgres
    return {"SLUICE_DATABASE_URL": url, "SLUICE_REDIS_URL": REDIS_URL,
            "SLUICE_REDIS_KEY_PREFIX": f"bench-scale-{uuid.uuid4().hex[:8]}:",
            "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1", "SLUICE_TELEGRAM_BOT_TOKEN": TOKEN,
            "SLUICE_TELEGRAM_API_URL": telegram_url, "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
            "SLUICE_TELEGRAM_RATE_PER_SECOND": str(BOT_RATE),
            "SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND": str(CHAT_RATE),
            "SLUICE_WEBHOOK_HOST_RATE_PER_SECOND": str(HOST_RATE),
            "SLUICE_DELIVERY_DRAIN_CONCURRENCY": str(concurrency(senders))} | {
        # a headroom to try passes through (the default is Sluice's own)
        key: os.environ[key] for key in ("SLUICE_DELIVERY_RATE_HEADROOM",) if key in os.environ}


def _split() -> tuple[int, int]:
    """Telegram and webhook entries in proportion to the rates the limits allow."""
    telegram_rate, webhook_rate = min(BOT_RATE, CHATS * CHAT_RATE), HOSTS * HOST_RATE
    telegram = round(ENTRIES * telegram_rate / (telegram_rate + webhook_rate))
    return telegram, ENTRIES - telegram


def _enqueue(services: Any, hooks: list[str]) -> None:
    from sluice.delivery.store import DeliveryStore

    store = DeliveryStore(services.db)
    telegram, webhook = _split()
    total = telegram + webhook
    sent_tg = sent_wh = 0
    for n in range(total):  # interleaved, so the oldest entries mix both channels
        if sent_tg * total < telegram * (n + 1) and sent_tg < telegram:
            store.enqueue("telegram", str(1000 + sent_tg % CHATS), {"text": f"m{n}"})
            sent_tg += 1
        else:
            store.enqueue("webhook", hooks[sent_wh % len(hooks)], {"text": f"m{n}"})
            sent_wh += 1


def _reset(services: Any) -> None:
    with services.db.transaction() as tx:
        tx.execute("DELETE FROM delivery_queue")
        tx.execute("DELETE FROM delivery_rate_limits")


def _sender(env: dict[str, str], go: Any, stop: Any, report: Any) -> None:
    """One sender, as its own process (a separate function): the real drain, run again and
    again until told to stop, with ``CONCURRENCY`` sends in flight."""
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.delivery.channels import Outbound
    from sluice.delivery.drain import Deliverer
    from sluice.jobs.registry import Deadline

    settings = Settings.from_env(env)
    services = Services.from_settings(settings)
    try:
        with Outbound.open(settings, deadline_s=3600) as client:
            deliverer = Deliverer.from_services(services, client)
            report.put(("ready", ""))
            go.wait()
            while not stop.is_set():
                done = deliverer.drain(Deadline(900))  # one long run, as a function's
                if not done["recovered"] and not done["rateLimited"]:
                    time.sleep(0.02)  # nothing due: poll again shortly
        report.put(("done", ""))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        report.put(("error", repr(exc)))
    finally:
        services.close()


def _run(url: str, senders: int) -> Run:
    from bench.scale.standins import LimitedHooks, LimitedTelegram
    from sluice.core.services import Services
    from sluice.core.settings import Settings
    from sluice.delivery.store import DeliveryStore

    processes = multiprocessing.get_context("spawn")
    with LimitedTelegram(TOKEN, BOT_RATE, CHAT_RATE) as telegram, \
            LimitedHooks(HOSTS, HOST_RATE) as hooks:
        env = _env(url, telegram.url, senders)
        main = Services.from_settings(Settings.from_env(env))
        _reset(main)
        _enqueue(main, hooks.urls)
        store = DeliveryStore(main.db)
        go, stop, report = processes.Event(), processes.Event(), processes.Queue()
        workers = [processes.Process(target=_sender, args=(env, go, stop, report), daemon=True)
                   for _ in range(senders)]
        for worker in workers:
            worker.start()
        errors = []
        for _ in workers:  # every sender connected and ready before the clock starts
            kind, detail = report.get(timeout=120)
            if kind != "ready":
                errors.append(detail)
        started = time.perf_counter()
        go.set()
        limit_s = ENTRIES / 5 + 60  # a slow machine still finishes; a stuck queue does not
        while time.perf_counter() - started < limit_s and not errors:
            if store.stats()["acked"]["count"] >= ENTRIES:
                break
            time.sleep(0.2)
            while not report.empty():
                kind, detail = report.get()
                if kind == "error":
                    errors.append(detail)
        wall = time.perf_counter() - started
        stop.set()
        for worker in workers:
            worker.join(60)
            if worker.is_alive():
                worker.kill()
        while not report.empty():
            kind, detail = report.get()
            if kind == "error":
                errors.append(detail)
        if errors:
            raise RuntimeError(f"a sender failed: {errors[0]}")
        stats = store.stats()
        with main.db.transaction() as tx:
            burned_row = tx.fetchone("SELECT count(*) AS n FROM delivery_queue "
                                     "WHERE attempts > 1")
        main.close()
        accepted = telegram.accepted + hooks.accepted
        duplicates = sum(count - 1 for count in accepted.values() if count > 1)
        acked = stats["acked"]["count"]
        return Run(wall, acked, telegram.refused + hooks.refused,
                   duplicates, max(0, acked - len(accepted)),
                   int(burned_row["n"]) if burned_row else 0)


def _allowed() -> float:
    return float(min(BOT_RATE, CHATS * CHAT_RATE) + HOSTS * HOST_RATE)


def run() -> list[Row]:
    rows = []
    with scratch_url() as url:
        for senders in SENDERS:
            result = _run(url, senders)
            rate = result.delivered / result.wall_s
            rows.append(row(f"scale delivery: {senders} sender(s), delivered/s", rate,
                            _allowed(), "msg/s", True,
                            note=f"{concurrency(senders)} in flight each; "
                                 f"{ENTRIES} entries in {result.wall_s:.1f} s; 429s "
                                 f"{result.refused}, duplicates {result.duplicates}, lost "
                                 f"{result.lost}, attempts burned {result.burned}; "
                                 "target ratio >= 0.9"))
            if result.delivered < ENTRIES:
                print(f"scale delivery: {senders} sender(s) stopped at the time limit with "
                      f"{ENTRIES - result.delivered} entries still queued", file=sys.stderr)
            assert result.duplicates == 0 and result.burned == 0, result
    return rows
