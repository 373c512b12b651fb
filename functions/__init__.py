"""Thin Lambda entry points; everything that decides anything lives in shared/.

Importing any handler first loads the configured secrets (SSM / Secrets Manager) into
the environment, before a handler module builds its Settings: every settings field
marked ``secret`` (delivery channel credentials included). With none configured this
costs nothing.
"""

from shared.core.secrets import load_secrets

load_secrets()
