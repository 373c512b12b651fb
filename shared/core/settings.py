"""Settings, read once from the environment and validated at start-up.

A bad value raises ``ConfigurationError`` naming the variable, so a
misconfigured function fails at cold start rather than on its first message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from shared.core.errors import ConfigurationError

DEFAULT_DATABASE_URL = "sqlite:///./.sluice/sluice.db"
MIN_CRON_SECRET_LENGTH = 16

QueueMode = Literal["local", "sqs"]
SmtpSecurity = Literal["starttls", "ssl", "none"]


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = _str(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise ConfigurationError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = _str(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise ConfigurationError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _url(env: Mapping[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    raw = _str(env, name)
    if raw is None:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in schemes:
        raise ConfigurationError(f"{name} must start with one of {', '.join(schemes)}://")
    if parts.scheme in ("http", "https", "redis", "rediss") and not parts.hostname:
        raise ConfigurationError(f"{name} has no host: {raw!r}")
    return raw


class Settings(NamedTuple):
    stage: str = "dev"
    cron_secret: str | None = None
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    upstash_redis_rest_url: str | None = None
    upstash_redis_rest_token: str | None = None
    redis_key_prefix: str = ""
    admin_jwt_secret: str | None = None
    admin_jwks_url: str | None = None
    admin_jwt_audience: str | None = None
    admin_jwt_issuer: str | None = None
    sentry_dsn: str | None = None
    deadline_margin_s: float = 5.0
    # billing (metering-flush)
    polar_access_token: str | None = None
    polar_api_url: str = "https://api.polar.sh"
    metering_events_per_request: int = 1
    # push queues
    queue_signing_secrets: tuple[str, ...] = ()
    queue_mode: QueueMode = "local"
    queue_prefix: str = "sluice-dev-"
    # erasure
    erasure_grace_days: int = 7
    # retention of the run log and the admin audit trail (state-cleanup)
    job_runs_retention_days: int = 90
    audit_retention_days: int = 400
    # delivery queue (shared/delivery/store.py, shared/delivery/channels.py)
    delivery_lease_s: int = 120
    delivery_retention_days: int = 7
    delivery_send_timeout_s: float = 10.0
    webhook_signing_secret: str | None = None
    slack_bot_token: str | None = None
    slack_api_url: str = "https://slack.com/api"
    telegram_bot_token: str | None = None
    telegram_api_url: str = "https://api.telegram.org"
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_security: SmtpSecurity = "starttls"
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_from: str | None = None

    @property
    def database_backend(self) -> Literal["sqlite", "postgres"]:
        return "sqlite" if self.database_url.startswith("sqlite:") else "postgres"

    @property
    def redis_configured(self) -> bool:
        return bool(self.redis_url or self.upstash_redis_rest_url)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        stage = _str(env, "SLUICE_STAGE") or "dev"

        cron_secret = _str(env, "CRON_SECRET")
        if cron_secret is not None:
            if len(cron_secret) < MIN_CRON_SECRET_LENGTH:
                raise ConfigurationError(
                    f"CRON_SECRET must be at least {MIN_CRON_SECRET_LENGTH} characters"
                )
            if not cron_secret.isascii() or not cron_secret.isprintable():
                raise ConfigurationError("CRON_SECRET must be printable ASCII")

        database_url = _url(env, "SLUICE_DATABASE_URL", ("sqlite", "postgresql", "postgres"))
        redis_url = _url(env, "SLUICE_REDIS_URL", ("redis", "rediss", "unix"))
        upstash_url = _url(env, "UPSTASH_REDIS_REST_URL", ("http", "https"))
        upstash_token = _str(env, "UPSTASH_REDIS_REST_TOKEN")
        if bool(upstash_url) != bool(upstash_token):
            raise ConfigurationError(
                "UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN must be set together"
            )
        if redis_url and upstash_url:
            raise ConfigurationError(
                "set either SLUICE_REDIS_URL or UPSTASH_REDIS_REST_URL, not both"
            )

        jwt_secret = _str(env, "SLUICE_ADMIN_JWT_SECRET")
        if jwt_secret is not None and len(jwt_secret) < 32:
            raise ConfigurationError("SLUICE_ADMIN_JWT_SECRET must be at least 32 characters")
        jwks_url = _url(env, "SLUICE_ADMIN_JWKS_URL", ("http", "https"))

        secrets = tuple(s.strip() for s in (env.get("SLUICE_QUEUE_SIGNING_SECRET") or "").split(","))
        secrets = tuple(s for s in secrets if s)
        if any(len(s) < MIN_CRON_SECRET_LENGTH for s in secrets):
            raise ConfigurationError(
                f"each SLUICE_QUEUE_SIGNING_SECRET entry must be at least "
                f"{MIN_CRON_SECRET_LENGTH} characters"
            )
        queue_mode = _str(env, "SLUICE_QUEUE_MODE") or "local"
        if queue_mode not in ("local", "sqs"):
            raise ConfigurationError(f"SLUICE_QUEUE_MODE must be 'local' or 'sqs', got {queue_mode!r}")

        return cls(
            stage=stage,
            cron_secret=cron_secret,
            database_url=database_url or DEFAULT_DATABASE_URL,
            redis_url=redis_url,
            upstash_redis_rest_url=upstash_url,
            upstash_redis_rest_token=upstash_token,
            redis_key_prefix=env.get("SLUICE_REDIS_KEY_PREFIX", ""),
            admin_jwt_secret=jwt_secret,
            admin_jwks_url=jwks_url,
            admin_jwt_audience=_str(env, "SLUICE_ADMIN_JWT_AUDIENCE"),
            admin_jwt_issuer=_str(env, "SLUICE_ADMIN_JWT_ISSUER"),
            sentry_dsn=_url(env, "SENTRY_DSN", ("http", "https")),
            deadline_margin_s=_float(env, "SLUICE_DEADLINE_MARGIN_SECONDS", 5.0, 0.0, 60.0),
            polar_access_token=_str(env, "POLAR_ACCESS_TOKEN"),
            polar_api_url=(_url(env, "POLAR_API_URL", ("http", "https")) or "https://api.polar.sh").rstrip("/"),
            metering_events_per_request=_int(env, "SLUICE_METERING_EVENTS_PER_REQUEST", 1, 1, 100),
            queue_signing_secrets=secrets,
            queue_mode=queue_mode,  # type: ignore[arg-type]
            queue_prefix=_str(env, "SLUICE_QUEUE_PREFIX") or f"sluice-{stage}-",
            erasure_grace_days=_int(env, "SLUICE_ERASURE_GRACE_DAYS", 7, 0, 365),
            job_runs_retention_days=_int(env, "SLUICE_JOB_RUNS_RETENTION_DAYS", 90, 1, 3650),
            audit_retention_days=_int(env, "SLUICE_AUDIT_RETENTION_DAYS", 400, 30, 3650),
            **_delivery(env),
        )


def _delivery(env: Mapping[str, str]) -> dict[str, Any]:
    """The delivery queue's settings: an adapter is configured when its credential is set."""
    secret = _str(env, "SLUICE_WEBHOOK_SIGNING_SECRET")
    if secret is not None and len(secret) < MIN_CRON_SECRET_LENGTH:
        raise ConfigurationError(
            f"SLUICE_WEBHOOK_SIGNING_SECRET must be at least {MIN_CRON_SECRET_LENGTH} characters")
    security = _str(env, "SLUICE_SMTP_SECURITY") or "starttls"
    if security not in ("starttls", "ssl", "none"):
        raise ConfigurationError(
            f"SLUICE_SMTP_SECURITY must be starttls, ssl or none, got {security!r}")
    smtp_host = _str(env, "SLUICE_SMTP_HOST")
    smtp_from = _str(env, "SLUICE_SMTP_FROM")
    if smtp_host and not smtp_from:
        raise ConfigurationError("SLUICE_SMTP_FROM must be set when SLUICE_SMTP_HOST is")
    if bool(_str(env, "SLUICE_SMTP_USERNAME")) != bool(_str(env, "SLUICE_SMTP_PASSWORD")):
        raise ConfigurationError("SLUICE_SMTP_USERNAME and SLUICE_SMTP_PASSWORD must be set together")
    return {
        "delivery_lease_s": _int(env, "SLUICE_DELIVERY_LEASE_SECONDS", 120, 1, 3600),
        "delivery_retention_days": _int(env, "SLUICE_DELIVERY_RETENTION_DAYS", 7, 1, 365),
        "delivery_send_timeout_s": _float(env, "SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS", 10.0,
                                          0.1, 60.0),
        "webhook_signing_secret": secret,
        "slack_bot_token": _str(env, "SLUICE_SLACK_BOT_TOKEN"),
        "slack_api_url": (_url(env, "SLUICE_SLACK_API_URL", ("http", "https"))
                          or "https://slack.com/api").rstrip("/"),
        "telegram_bot_token": _str(env, "SLUICE_TELEGRAM_BOT_TOKEN"),
        "telegram_api_url": (_url(env, "SLUICE_TELEGRAM_API_URL", ("http", "https"))
                             or "https://api.telegram.org").rstrip("/"),
        "smtp_host": smtp_host,
        "smtp_port": _int(env, "SLUICE_SMTP_PORT", 587, 1, 65535),
        "smtp_security": security,
        "smtp_username": _str(env, "SLUICE_SMTP_USERNAME"),
        "smtp_password": _str(env, "SLUICE_SMTP_PASSWORD"),
        "smtp_from": smtp_from,
    }
