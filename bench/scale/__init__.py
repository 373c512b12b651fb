"""``python -m bench scale [--json]``: Sluice past one function.

Two measurements, on loopback stand-ins, each against its own baseline measured in
the same run (see ``bench/scale/rss.py`` and ``bench/scale/delivery.py``):

* the rss tick fanned out over ``rss.ingest`` to 1, 4 and 16 concurrent consumers,
  against the inline tick;
* the delivery queue drained by 1, 4 and 8 concurrent senders under the providers'
  rate limits, against the rate those limits allow.

Sizes come from ``SLUICE_BENCH_SCALE_*`` variables (the defaults are the issue's), so a
development run can be small.
"""

from __future__ import annotations

from bench.common import Row


def run() -> list[Row]:
    import sys

    from bench.__main__ import print_rows
    from bench.scale import delivery, rss

    rows = []
    for part in (rss, delivery):
        produced = part.run()
        print_rows(produced, sys.stderr)  # each part's rows as soon as it has them
        rows += produced
    return rows
