"""The alerts pack: tenants' alert rules over the RSS catalog, matched by the rss tick's
sweep and as new stories arrive (``sluice.rss.sweep``); matches become deliveries.

It declares no job, topic or channel of its own: the rss pack's tick runs its sweep, and
the delivery pack sends what it enqueues.
"""

from __future__ import annotations
