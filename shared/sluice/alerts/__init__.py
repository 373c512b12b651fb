"""Alerts: per-scope rules over the rss catalog, matched stories onto the delivery queue.

Importing the package registers the new-stories listener on the catalog (once); the
rss tick imports it through ``sluice.rss.sweep.ALERT_SWEEP_TARGET``.
"""

from __future__ import annotations

from sluice.alerts.evaluate import on_new_stories
from sluice.rss import catalog

if on_new_stories not in catalog.on_new_stories:
    catalog.on_new_stories.append(on_new_stories)
