"""Sluice's own packs: one module each, declaring its work as an app does.

Each module holds ``JOBS``, ``TOPICS`` and ``CHANNELS`` made with ``sluice.extend``, and
nothing else: the pack table (``sluice.core.packs``) names the modules, and the app's
``PACKS`` says which of them a deployment loads (``sluice.core.extensions``).
"""
