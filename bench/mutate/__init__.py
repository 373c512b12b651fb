"""``python -m bench mutate``: realistic defects put into Sluice's product code one at a
time, in a scratch copy of the tree, each run through the simulator (``bench.simulate``).

The defects are data (``catalog.toml``: the product file, the exact code to find, its
replacement, what it breaks); ``catalog.py`` reads and checks them, ``main.py`` applies each
to its own copy and prints which the simulator killed (the invariant, seed and simulated
day that caught it) and which survived. See docs/reliability.md.
"""
