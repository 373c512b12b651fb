"""``python -m bench simulate``: months of Sluice's operation on a simulated clock.

The real code (the jobs through the real job runner, the rss tick with its fetcher,
catalog and alert sweep, the delivery drain with its real channel adapters and retry
policy, AI usage through the ledger, metering-flush and ledger-redrive through Sluice's
Redis client (on a fakeredis server whose keys expire on the simulated clock), state
cleanup, erasure, the operator's purge and redrive) on SQLite or Postgres (``stores.py``),
against a world
generated from one seed: feeds, tenants, rules and usage (``world.py``), peers with
behaviours, Polar among them (``peers.py``), store outages (``outages.py``), crashes at the
named crash points (``crashes.py``), invariants checked after every step
(``invariants.py``, ``billing.py``). ``firing.py`` decides which scheduled firings can do
something, ``engine.py`` runs one seed, ``main.py`` prints the table. ``--limits`` adds
the worlds of ``limits.py``, delivery in production shapes (``isolation.py``, judged by
``fairness.py``) and missed runs (``missed.py``); ``charges.py`` names the entries a
stopped drain run left claimed, and the one a crash hit; ``--coverage`` measures what the worlds execute (``reach.py``) and which delivery
policy rows they reach (``rows.py``). See docs/reliability.md.
"""
