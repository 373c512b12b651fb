"""Secrets at cold start: SSM Parameter Store / Secrets Manager into the environment.

On Lambda the template carries only where secrets live, never their values:
``SLUICE_SECRETS_PATH`` names an SSM path (``/sluice/<stage>/``) under which each known
secret (a settings field marked ``secret``: credentials, tokens, connection URLs) is a
parameter of the same name (``/sluice/prod/CRON_SECRET``, SecureString), and
``<NAME>_PARAM`` points one secret elsewhere: an SSM parameter name, or a Secrets Manager
secret as ``secretsmanager:<id or ARN>``. ``load_secrets`` sets the variables that
``Settings.from_env`` reads; a variable already set in the environment wins.

Cold-start cost decides the shape. The parameter names are known in advance (the settings
table), so every SSM secret is read by ``GetParameters`` (ten names a call, the API's
limit), never by walking the path. The calls go through one botocore low-level client per
process, built on first use: boto3 is never imported (its import pulls s3transfer), nor
Powertools Parameters (which builds on boto3), nor anything at all when no secret is
configured.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, MutableMapping
from functools import cache
from typing import Any

from shared.core.errors import ConfigurationError
from shared.core.settings import secret_variables

PATH_VAR = "SLUICE_SECRETS_PATH"
PARAM_SUFFIX = "_PARAM"
SECRETS_MANAGER = "secretsmanager:"
GET_PARAMETERS_MAX = 10  # names per SSM GetParameters call
# Every settings field marked ``secret``, and only those: the table decides what is loadable.
SECRET_NAMES = secret_variables()


class SecretNotFound(ConfigurationError):
    """A configured secret does not exist where its variable says it lives."""

    def __init__(self, variable: str, where: str) -> None:
        super().__init__(f"{variable}: no such secret {where!r}")
        self.variable = variable
        self.where = where


def configured(env: MutableMapping[str, str]) -> bool:
    return bool(env.get(PATH_VAR, "").strip()) or any(
        env.get(name + PARAM_SUFFIX, "").strip() for name in SECRET_NAMES
    )


@cache
def _client(service: str) -> Any:
    """One botocore client per service and process (region, credentials and endpoint,
    ``AWS_ENDPOINT_URL_SSM`` included, from the environment as the SDK reads them)."""
    import botocore.session  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    config = Config(retries={"mode": "standard", "max_attempts": 3},
                    connect_timeout=3, read_timeout=5)
    return botocore.session.get_session().create_client(service, config=config)


def _chunks(names: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(names), size):
        yield names[start:start + size]


def _get_parameters(ssm: Any, names: Iterable[str]) -> dict[str, str]:
    """Requested name -> decrypted value, for those that exist (GetParameters, batched)."""
    wanted = list(dict.fromkeys(names))
    found: dict[str, str] = {}
    for chunk in _chunks(wanted, GET_PARAMETERS_MAX):
        answer = ssm.get_parameters(Names=chunk, WithDecryption=True)
        for param in answer.get("Parameters", []):
            # a name may have been asked for by ARN or with a :version / :label selector
            keys = {param["Name"], param.get("ARN", ""),
                    param["Name"] + param.get("Selector", "")}
            for key in keys & set(chunk):
                found[key] = param["Value"]
    return found


def load_secrets(env: MutableMapping[str, str] | None = None, *, ssm: Any = None,
                 secrets_manager: Any = None) -> list[str]:
    """Fetch the configured secrets into ``env`` (``os.environ``); return the names set.

    ``ssm`` / ``secrets_manager`` are botocore or boto3 clients (the process's own, built
    from the environment, if omitted). A ``<NAME>_PARAM`` that names no existing secret
    raises ``SecretNotFound`` naming that variable, and any other failure to read raises
    ``ConfigurationError`` naming the variable that configured it, so the function fails
    at cold start, not on first use. Under ``SLUICE_SECRETS_PATH`` each secret is optional.
    """
    env = os.environ if env is None else env
    if not configured(env):
        return []
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

    path = env.get(PATH_VAR, "").strip()
    under_path = {"/" + path.strip("/") + "/" + name: name for name in SECRET_NAMES} if path else {}
    pointed = {name: env[name + PARAM_SUFFIX].strip() for name in SECRET_NAMES
               if env.get(name + PARAM_SUFFIX, "").strip()}
    in_ssm = {name: where for name, where in pointed.items()
              if not where.startswith(SECRETS_MANAGER)}

    found: dict[str, str] = {}
    if under_path or in_ssm:
        try:
            values = _get_parameters(ssm or _client("ssm"), [*under_path, *in_ssm.values()])
        except (BotoCoreError, ClientError) as exc:
            variable = PATH_VAR if path else next(iter(in_ssm)) + PARAM_SUFFIX
            raise ConfigurationError(f"{variable}: cannot read SSM parameters: {exc}") from exc
        found.update({name: values[key] for key, name in under_path.items() if key in values})
        for name, where in in_ssm.items():
            if where not in values:
                raise SecretNotFound(name + PARAM_SUFFIX, where)
            found[name] = values[where]

    for name, where in pointed.items():
        if not where.startswith(SECRETS_MANAGER):
            continue
        secret_id = where.removeprefix(SECRETS_MANAGER)
        client = secrets_manager or _client("secretsmanager")
        try:
            found[name] = client.get_secret_value(SecretId=secret_id)["SecretString"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                raise SecretNotFound(name + PARAM_SUFFIX, where) from exc
            raise ConfigurationError(f"{name}{PARAM_SUFFIX}: cannot read {where!r}: {exc}") from exc
        except (BotoCoreError, KeyError) as exc:
            raise ConfigurationError(f"{name}{PARAM_SUFFIX}: cannot read {where!r}: {exc}") from exc

    loaded = []
    for name, value in sorted(found.items()):
        if env.get(name, "").strip():
            continue  # set directly in the environment: that wins
        env[name] = value
        loaded.append(name)
    return loaded
