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
limit), never by walking the path. With credentials in the environment, as on Lambda, the
calls are signed POSTs over ``http.client`` (``sluice.core.awsjson``, signed by
``sluice.core.sigv4``): no SDK is imported, since importing botocore alone costs more than
the cold start's budget for secrets. Otherwise (profiles, SSO, container credentials, a
proxy) they go through one botocore low-level client per service and process. boto3 and
Powertools Parameters are never imported, nor anything at all when no secret is configured.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, MutableMapping
from functools import cache
from typing import Any

from sluice.core import awsjson
from sluice.core.errors import ConfigurationError
from sluice.core.settings import secret_variables

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
    """One client per service and process: the stdlib one when the environment holds the
    credentials, else botocore's (region, credentials and endpoint, ``AWS_ENDPOINT_URL_SSM``
    included, from the environment and config files as the SDK reads them)."""
    fast = awsjson.from_environ(service, os.environ)
    if fast is not None:
        return fast
    import botocore.session  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    config = Config(retries={"mode": "standard", "max_attempts": 3},
                    connect_timeout=3, read_timeout=5)
    return botocore.session.get_session().create_client(service, config=config)


def _read_errors(client: Any) -> tuple[type[Exception], ...]:
    """What a failed read raises through ``client`` (botocore's only if it is botocore's)."""
    if isinstance(client, awsjson.JsonClient):
        return (awsjson.AwsError,)
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

    return (awsjson.AwsError, BotoCoreError, ClientError)


def _error_code(exc: Exception) -> str:
    if isinstance(exc, awsjson.AwsError):
        return exc.code
    code: str = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code


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

    ``ssm`` / ``secrets_manager`` are botocore, boto3 or ``awsjson`` clients (the process's
    own, built from the environment, if omitted). A ``<NAME>_PARAM`` that names no existing
    secret raises ``SecretNotFound`` naming that variable, and any other failure to read raises
    ``ConfigurationError`` naming the variable that configured it, so the function fails
    at cold start, not on first use. Under ``SLUICE_SECRETS_PATH`` each secret is optional.
    """
    env = os.environ if env is None else env
    if not configured(env):
        return []
    path = env.get(PATH_VAR, "").strip()
    under_path = {"/" + path.strip("/") + "/" + name: name for name in SECRET_NAMES} if path else {}
    pointed = {name: env[name + PARAM_SUFFIX].strip() for name in SECRET_NAMES
               if env.get(name + PARAM_SUFFIX, "").strip()}
    in_ssm = {name: where for name, where in pointed.items()
              if not where.startswith(SECRETS_MANAGER)}

    found: dict[str, str] = {}
    if under_path or in_ssm:
        ssm = ssm or _client("ssm")
        try:
            values = _get_parameters(ssm, [*under_path, *in_ssm.values()])
        except _read_errors(ssm) as exc:
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
        errors: tuple[type[Exception], ...] = (*_read_errors(client), KeyError)
        try:
            found[name] = client.get_secret_value(SecretId=secret_id)["SecretString"]
        except errors as exc:
            if _error_code(exc) == "ResourceNotFoundException":
                raise SecretNotFound(name + PARAM_SUFFIX, where) from exc
            raise ConfigurationError(f"{name}{PARAM_SUFFIX}: cannot read {where!r}: {exc}") from exc

    loaded = []
    for name, value in sorted(found.items()):
        if env.get(name, "").strip():
            continue  # set directly in the environment: that wins
        env[name] = value
        loaded.append(name)
    return loaded
