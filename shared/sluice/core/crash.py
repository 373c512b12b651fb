"""Named crash points: places where a test can make the process die on demand.

``crash_point("metering.after_send")`` does nothing unless ``SLUICE_CRASH_AT``
names that point, in which case the process ends at once with ``os._exit`` (no
``finally``, no flush, no atexit: the closest thing to a kill). ``name@N`` dies
on the N-th time the point is reached. Off unless a test asks.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

CRASH_EXIT_CODE = 86
ENV = "SLUICE_CRASH_AT"
_hits: Counter[str] = Counter()


def crash_point(name: str) -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    _hits[name] += 1
    for spec in wanted.split(","):
        point, _, nth = spec.strip().partition("@")
        if point == name and _hits[name] == (int(nth) if nth else 1):
            sys.stderr.write(f"sluice: crash point {name} reached, exiting\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
