"""Secrets at cold start: SSM Parameter Store / Secrets Manager into the environment.

On Lambda the template carries only where secrets live, never their values:
``SLUICE_SECRETS_PATH`` names an SSM path (``/sluice/<stage>/``) under which each known
secret (a settings field marked ``secret``: credentials, tokens, connection URLs) is a
parameter of the same name (``/sluice/prod/CRON_SECRET``, SecureString), and
``<NAME>_PARAM`` points one secret elsewhere: an SSM parameter name, or a Secrets Manager
secret as ``secretsmanager:<id or ARN>``. ``load_secrets`` reads them through Powertools
Parameters (cached for ``POWERTOOLS_PARAMETERS_MAX_AGE``) and sets the variables that
``Settings.from_env`` reads; a variable already set in the environment wins.

Nothing is imported unless something is configured, so a function without secrets pays
no cold-start cost for Powertools or boto3.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from shared.core.errors import ConfigurationError
from shared.core.settings import secret_variables

PATH_VAR = "SLUICE_SECRETS_PATH"
PARAM_SUFFIX = "_PARAM"
SECRETS_MANAGER = "secretsmanager:"
# Every settings field marked ``secret``, and only those: the table decides what is loadable.
SECRET_NAMES = secret_variables()


def configured(env: MutableMapping[str, str]) -> bool:
    return bool(env.get(PATH_VAR, "").strip()) or any(
        env.get(name + PARAM_SUFFIX, "").strip() for name in SECRET_NAMES
    )


def load_secrets(env: MutableMapping[str, str] | None = None, *, ssm: Any = None,
                 secrets_manager: Any = None) -> list[str]:
    """Fetch the configured secrets into ``env`` (``os.environ``); return the names set.

    ``ssm`` / ``secrets_manager`` are boto3 clients (built from the environment if
    omitted). A configured secret that cannot be read raises ``ConfigurationError``
    naming its variable, so the function fails at cold start, not on first use.
    """
    env = os.environ if env is None else env
    if not configured(env):
        return []
    from aws_lambda_powertools.utilities import parameters
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

    ssm_provider = parameters.SSMProvider(boto3_client=ssm) if ssm else parameters.SSMProvider()
    found: dict[str, str] = {}

    path = env.get(PATH_VAR, "").strip()
    if path:
        path = "/" + path.strip("/")
        try:
            values = ssm_provider.get_multiple(path, decrypt=True)
        except (BotoCoreError, ClientError, parameters.GetParameterError) as exc:
            raise ConfigurationError(f"{PATH_VAR}: cannot read SSM path {path!r}: {exc}") from exc
        found.update({name: str(value) for name, value in values.items() if name in SECRET_NAMES})

    for name in SECRET_NAMES:
        where = env.get(name + PARAM_SUFFIX, "").strip()
        if not where:
            continue
        try:
            if where.startswith(SECRETS_MANAGER):
                provider = (parameters.SecretsProvider(boto3_client=secrets_manager)
                            if secrets_manager else parameters.SecretsProvider())
                value = provider.get(where.removeprefix(SECRETS_MANAGER))
            else:
                value = ssm_provider.get(where, decrypt=True)
        except (BotoCoreError, ClientError, parameters.GetParameterError) as exc:
            raise ConfigurationError(f"{name}{PARAM_SUFFIX}: cannot read {where!r}: {exc}") from exc
        found[name] = value if isinstance(value, str) else str(value)

    loaded = []
    for name, value in sorted(found.items()):
        if env.get(name, "").strip():
            continue  # set directly in the environment: that wins
        env[name] = value
        loaded.append(name)
    return loaded
