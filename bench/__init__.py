"""Benchmarks: ``python -m bench [name ...]`` runs bench/<name>.py modules and prints a table.

Each module exposes ``run() -> list[dict]``; every row carries ``name``, ``sluice``,
``baseline``, ``unit``, ``ratio`` and optionally ``note`` (see ``bench.common.row``).
"""
