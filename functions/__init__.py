"""Sluice's own Lambda entry points, as serverless.yml names them (``functions/cron.handler``).

Each module is the packaged handler of the same name in ``sluice.lambda_handlers``, where
an app's deployment reaches it from the installed wheel; importing this package loads the
configured secrets first, as that package does (``cold_start``, ``load_secrets``).
"""

from __future__ import annotations

from sluice.lambda_handlers import cold_start

__all__ = ["cold_start"]
