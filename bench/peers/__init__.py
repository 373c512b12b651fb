"""``python -m bench peers``: Sluice's durable queue against the queues Python users pick.

Each side enqueues N no-op jobs through its own public API, then processes all N to
completion with the same number of workers, at its default durability, on a database of
its own (a fresh Postgres database, or a fresh SQLite file) and in a process of its own
(``bench.peers.child``), so no side inherits another's event loop, threads or caches.
``bench.peers.main`` runs them one after another, measures the machine's own commit rate
in the same run, and prints the table.
"""
