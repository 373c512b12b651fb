"""``python -m bench simulate``: months of Sluice's operation on a simulated clock.

The real code (the jobs through the real job runner, the rss tick with its fetcher,
catalog and alert sweep, the delivery drain with its real channel adapters and retry
policy, state cleanup, erasure, the operator's purge and redrive) on SQLite, against a
world generated from one seed: feeds (``world.py``) and peers with behaviours
(``peers.py``), crashes at the named crash points (``crashes.py``), invariants checked after
every step (``invariants.py``). ``engine.py`` runs one seed, ``main.py`` prints the table.
See docs/reliability.md.
"""
