"""Settings, read once from the environment and validated at start-up.

``Settings`` is the one table of configuration: each field declares its type, its
default and, in its ``Var`` annotation, the environment variable it is read from,
how that is parsed (bounds, URL schemes, choices, minimum length) and whether it is
a ``secret`` (loadable from SSM / Secrets Manager at cold start, never written in a
template). ``from_env`` walks the table, then checks the rules that tie fields
together. A bad value raises ``ConfigurationError`` naming the variable, so a
misconfigured function fails at cold start rather than on its first message.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Annotated, Any, Literal, NamedTuple, get_type_hints
from urllib.parse import urlsplit

from sluice.core.errors import ConfigurationError

DEFAULT_DATABASE_URL = "sqlite:///./.sluice/sluice.db"
MIN_CRON_SECRET_LENGTH = 16

QueueMode = Literal["local", "sqs"]
SmtpSecurity = Literal["starttls", "ssl", "none"]
# text: stripped, empty is unset; raw: as given; list: comma-separated text; duration: a
# whole number and a unit (s, m, h, d), read as seconds
Parse = Literal["text", "raw", "int", "float", "url", "choice", "list", "bool", "duration"]
_DURATION = re.compile(r"([0-9]{1,9})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Var(NamedTuple):
    """How one field is read from the environment."""

    name: str
    parse: Parse = "text"
    lo: float | None = None
    hi: float | None = None
    schemes: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    min_length: int = 0
    printable_ascii: bool = False
    strip_slash: bool = False
    secret: bool = False


_DB_SCHEMES = ("sqlite", "postgresql", "postgres")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_HTTP = ("http", "https")
_MIN = MIN_CRON_SECRET_LENGTH


class Settings(NamedTuple):
    stage: Annotated[str, Var("SLUICE_STAGE")] = "dev"
    cron_secret: Annotated[str | None, Var("CRON_SECRET", min_length=_MIN,
                                           printable_ascii=True, secret=True)] = None
    database_url: Annotated[str, Var("SLUICE_DATABASE_URL", "url", schemes=_DB_SCHEMES,
                                     secret=True)] = DEFAULT_DATABASE_URL
    redis_url: Annotated[str | None, Var("SLUICE_REDIS_URL", "url", schemes=_REDIS_SCHEMES,
                                         secret=True)] = None
    upstash_redis_rest_url: Annotated[str | None, Var("UPSTASH_REDIS_REST_URL", "url",
                                                      schemes=_HTTP, secret=True)] = None
    upstash_redis_rest_token: Annotated[str | None, Var("UPSTASH_REDIS_REST_TOKEN",
                                                        secret=True)] = None
    redis_key_prefix: Annotated[str, Var("SLUICE_REDIS_KEY_PREFIX", "raw")] = ""
    admin_jwt_secret: Annotated[str | None, Var("SLUICE_ADMIN_JWT_SECRET", min_length=32,
                                                secret=True)] = None
    admin_jwks_url: Annotated[str | None, Var("SLUICE_ADMIN_JWKS_URL", "url",
                                              schemes=_HTTP)] = None
    admin_jwt_audience: Annotated[str | None, Var("SLUICE_ADMIN_JWT_AUDIENCE")] = None
    admin_jwt_issuer: Annotated[str | None, Var("SLUICE_ADMIN_JWT_ISSUER")] = None
    sentry_dsn: Annotated[str | None, Var("SENTRY_DSN", "url", schemes=_HTTP,
                                          secret=True)] = None
    deadline_margin_s: Annotated[float, Var("SLUICE_DEADLINE_MARGIN_SECONDS", "float",
                                            0.0, 60.0)] = 5.0
    # the longest an app's call (sluice.publish, enqueue_delivery, record_usage, ...) waits
    # on a store or queue that does not answer, all of its round trips together
    request_path_timeout_s: Annotated[float, Var("SLUICE_REQUEST_PATH_TIMEOUT_SECONDS",
                                                 "float", 0.1, 30.0)] = 1.5
    # billing (metering-flush)
    polar_access_token: Annotated[str | None, Var("POLAR_ACCESS_TOKEN", secret=True)] = None
    polar_api_url: Annotated[str, Var("POLAR_API_URL", "url", schemes=_HTTP,
                                      strip_slash=True)] = "https://api.polar.sh"
    metering_events_per_request: Annotated[int, Var("SLUICE_METERING_EVENTS_PER_REQUEST",
                                                    "int", 1, 100)] = 1
    # the app's extension modules (shared/sluice/core/extensions.py), besides its entry points
    app_modules: Annotated[tuple[str, ...], Var("SLUICE_APP", "list")] = ()
    # push queues
    queue_signing_secrets: Annotated[tuple[str, ...], Var(
        "SLUICE_QUEUE_SIGNING_SECRET", "list", min_length=_MIN, secret=True)] = ()
    queue_mode: Annotated[QueueMode, Var("SLUICE_QUEUE_MODE", "choice",
                                         choices=("local", "sqs"))] = "local"
    queue_prefix: Annotated[str, Var("SLUICE_QUEUE_PREFIX")] = "sluice-dev-"  # sluice-<stage>-
    # where the console's "run now" hands a run (sluice.jobs.handoff): the job functions'
    # names less their key (``sluice-<stage>-``: Lambda Invoke), or unset: this process
    job_function_prefix: Annotated[str | None, Var("SLUICE_JOB_FUNCTION_PREFIX")] = None
    # erasure
    erasure_grace_days: Annotated[int, Var("SLUICE_ERASURE_GRACE_DAYS", "int", 0, 365)] = 7
    # retention of the run log and the admin audit trail (state-cleanup)
    job_runs_retention_days: Annotated[int, Var("SLUICE_JOB_RUNS_RETENTION_DAYS", "int",
                                                1, 3650)] = 90
    audit_retention_days: Annotated[int, Var("SLUICE_AUDIT_RETENTION_DAYS", "int",
                                             30, 3650)] = 400
    # delivery queue (shared/sluice/delivery/)
    delivery_lease_s: Annotated[int, Var("SLUICE_DELIVERY_LEASE_SECONDS", "int", 1, 3600)] = 120
    delivery_retention_days: Annotated[int, Var("SLUICE_DELIVERY_RETENTION_DAYS", "int",
                                                1, 365)] = 7
    delivery_send_timeout_s: Annotated[float, Var("SLUICE_DELIVERY_SEND_TIMEOUT_SECONDS",
                                                  "float", 0.1, 60.0)] = 10.0
    delivery_expire_s: Annotated[int, Var("SLUICE_DELIVERY_EXPIRE_SECONDS", "int",
                                          60, 30 * 86400)] = 86400
    delivery_outage_threshold: Annotated[int, Var("SLUICE_DELIVERY_OUTAGE_THRESHOLD", "int",
                                                  1, 100)] = 3
    # a destination failing this long without a single success is disabled (and pages)
    destination_disable_after_s: Annotated[int, Var("SLUICE_DESTINATION_DISABLE_AFTER",
                                                    "duration", 3600, 365 * 86400)] = 5 * 86400
    # sends allowed after an unknown outcome on a channel that cannot deduplicate
    delivery_unknown_resends: Annotated[int, Var("SLUICE_DELIVERY_UNKNOWN_RESENDS", "int",
                                                 0, 10)] = 1
    # Standard Webhooks secrets (whsec_...), comma-separated: each signs every request, so
    # a rotation lists the new one beside the old (sluice.core.webhooks)
    webhook_signing_secrets: Annotated[tuple[str, ...], Var(
        "SLUICE_WEBHOOK_SIGNING_SECRET", "list", secret=True)] = ()
    slack_bot_token: Annotated[str | None, Var("SLUICE_SLACK_BOT_TOKEN", secret=True)] = None
    slack_api_url: Annotated[str, Var("SLUICE_SLACK_API_URL", "url", schemes=_HTTP,
                                      strip_slash=True)] = "https://slack.com/api"
    telegram_bot_token: Annotated[str | None, Var("SLUICE_TELEGRAM_BOT_TOKEN",
                                                  secret=True)] = None
    telegram_api_url: Annotated[str, Var("SLUICE_TELEGRAM_API_URL", "url", schemes=_HTTP,
                                         strip_slash=True)] = "https://api.telegram.org"
    smtp_host: Annotated[str | None, Var("SLUICE_SMTP_HOST")] = None
    smtp_port: Annotated[int, Var("SLUICE_SMTP_PORT", "int", 1, 65535)] = 587
    smtp_security: Annotated[SmtpSecurity, Var("SLUICE_SMTP_SECURITY", "choice",
                                               choices=("starttls", "ssl", "none"))] = "starttls"
    smtp_username: Annotated[str | None, Var("SLUICE_SMTP_USERNAME")] = None
    smtp_password: Annotated[str | None, Var("SLUICE_SMTP_PASSWORD", secret=True)] = None
    smtp_from: Annotated[str | None, Var("SLUICE_SMTP_FROM")] = None
    # destinations named in data (shared/sluice/egress/): hosts, or host:port, exempt from the
    # address guard (only public addresses otherwise); one list per kind of destination
    webhook_allow_hosts: Annotated[tuple[str, ...], Var("SLUICE_WEBHOOK_ALLOW_HOSTS",
                                                        "list")] = ()
    # the proxies (addresses or CIDR ranges) whose X-Forwarded-For names the caller; from
    # anyone else the header is the caller's own claim (shared/sluice/http/app.py client_ip)
    trusted_proxies: Annotated[tuple[str, ...], Var("SLUICE_TRUSTED_PROXIES", "list")] = ()
    # rss ingestion (shared/sluice/rss/); the allow-list exempts feed hosts from the address guard
    feed_allow_hosts: Annotated[tuple[str, ...], Var("SLUICE_FEED_ALLOW_HOSTS", "list")] = ()
    tenant_ingestion_budget_ms: Annotated[int, Var("SLUICE_TENANT_INGESTION_TIME_BUDGET_MS",
                                                   "int", 1000, 900_000)] = 240_000
    rss_fetch_timeout_s: Annotated[float, Var("SLUICE_RSS_FETCH_TIMEOUT_SECONDS", "float",
                                              0.1, 120.0)] = 10.0
    rss_build_deadline_s: Annotated[float, Var("SLUICE_RSS_BUILD_DEADLINE_SECONDS", "float",
                                               1.0, 600.0)] = 40.0
    rss_max_feed_bytes: Annotated[int, Var("SLUICE_RSS_MAX_FEED_BYTES", "int",
                                           1024, 100_000_000)] = 5_000_000
    # entries a feed reader is given from one document, and from all of one build's feeds
    rss_max_feed_entries: Annotated[int, Var("SLUICE_RSS_MAX_FEED_ENTRIES", "int",
                                             1, 10_000)] = 500
    rss_max_build_entries: Annotated[int, Var("SLUICE_RSS_MAX_BUILD_ENTRIES", "int",
                                              1, 1_000_000)] = 20_000
    rss_max_redirects: Annotated[int, Var("SLUICE_RSS_MAX_REDIRECTS", "int", 0, 20)] = 5
    rss_fetch_concurrency: Annotated[int, Var("SLUICE_RSS_FETCH_CONCURRENCY", "int",
                                              1, 64)] = 8
    rss_per_host_connections: Annotated[int, Var("SLUICE_RSS_PER_HOST_CONNECTIONS", "int",
                                                 1, 16)] = 2
    rss_build_ttl_s: Annotated[int, Var("SLUICE_RSS_BUILD_TTL_SECONDS", "int",
                                        60, 7 * 86400)] = 3600
    rss_scope_min_interval_s: Annotated[int, Var("SLUICE_RSS_SCOPE_MIN_INTERVAL_SECONDS",
                                                 "int", 0, 86400)] = 240
    rss_lock_wait_s: Annotated[float, Var("SLUICE_RSS_LOCK_WAIT_SECONDS", "float",
                                          0.0, 60.0)] = 5.0
    # the tick's fan-out: rss.ingest consumers building in parallel (the topic's concurrency)
    rss_ingest_concurrency: Annotated[int, Var("SLUICE_RSS_INGEST_CONCURRENCY", "int",
                                               1, 1000)] = 5
    # delivery rate limits (shared/sluice/delivery/ratelimit.py), shared by every concurrent sender
    telegram_rate_per_s: Annotated[float, Var("SLUICE_TELEGRAM_RATE_PER_SECOND", "float",
                                              0.01, 10_000.0)] = 30.0
    telegram_chat_rate_per_s: Annotated[float, Var("SLUICE_TELEGRAM_CHAT_RATE_PER_SECOND",
                                                   "float", 0.01, 1000.0)] = 1.0
    telegram_group_rate_per_min: Annotated[float, Var(
        "SLUICE_TELEGRAM_GROUP_RATE_PER_MINUTE", "float", 0.1, 60_000.0)] = 20.0
    slack_channel_rate_per_s: Annotated[float, Var("SLUICE_SLACK_CHANNEL_RATE_PER_SECOND",
                                                   "float", 0.01, 1000.0)] = 1.0
    webhook_host_rate_per_s: Annotated[float, Var("SLUICE_WEBHOOK_HOST_RATE_PER_SECOND",
                                                  "float", 0.01, 10_000.0)] = 10.0
    delivery_rate_wait_s: Annotated[float, Var("SLUICE_DELIVERY_RATE_WAIT_SECONDS", "float",
                                               0.0, 60.0)] = 1.0
    # the fraction below each limit Sluice spaces its sends at: jitter between a sender and
    # the provider must not turn sends spaced exactly at the limit into a 429
    delivery_rate_headroom: Annotated[float, Var("SLUICE_DELIVERY_RATE_HEADROOM", "float",
                                                 0.0, 0.5)] = 0.05
    # the longest wait a provider's pacing answer (Retry-After, retry_after) is honoured for
    # (shared/sluice/egress/pacing.py); one asking for longer is its destination failing
    delivery_pacing_cap_s: Annotated[int, Var("SLUICE_DELIVERY_PACING_CAP_SECONDS", "int",
                                              1, 86400)] = 3600
    # sends one drain run keeps in flight at once (threads, each claim -> send -> settle)
    delivery_drain_concurrency: Annotated[int, Var("SLUICE_DELIVERY_DRAIN_CONCURRENCY", "int",
                                                   1, 64)] = 1
    # Postgres connections (shared/sluice/store/db.py PgOptions); prepared statements off suits
    # PgBouncer's transaction pooling, where a prepared statement may land on another session
    database_connect_timeout_s: Annotated[int, Var("SLUICE_DATABASE_CONNECT_TIMEOUT_SECONDS",
                                                   "int", 1, 60)] = 5
    database_statement_timeout_s: Annotated[float, Var(
        "SLUICE_DATABASE_STATEMENT_TIMEOUT_SECONDS", "float", 0.1, 900.0)] = 30.0
    database_prepared_statements: Annotated[bool, Var("SLUICE_DATABASE_PREPARED_STATEMENTS",
                                                      "bool")] = True

    @property
    def database_backend(self) -> Literal["sqlite", "postgres"]:
        return "sqlite" if self.database_url.startswith("sqlite:") else "postgres"

    @property
    def redis_configured(self) -> bool:
        return bool(self.redis_url or self.upstash_redis_rest_url)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, var in fields().items():
            value = _read(env, var)
            if value is not None:
                values[field] = value
        if "queue_prefix" not in values:
            values["queue_prefix"] = f"sluice-{values.get('stage', 'dev')}-"
        for rule in RULES:
            rule(values)
        return cls(**values)


@cache
def fields() -> dict[str, Var]:
    """Field name -> its ``Var``, in declaration order (every field has one)."""
    hints = get_type_hints(Settings, include_extras=True)
    found = {name: next((m for m in getattr(hints[name], "__metadata__", ())
                         if isinstance(m, Var)), None) for name in Settings._fields}
    missing = [name for name, var in found.items() if var is None]
    if missing:
        raise ConfigurationError(f"Settings fields without a Var: {', '.join(missing)}")
    return {name: var for name, var in found.items() if var is not None}


def secret_variables() -> tuple[str, ...]:
    """The variables of fields marked ``secret``: what the cold-start loader may fetch."""
    return tuple(var.name for var in fields().values() if var.secret)


# --- parsing one variable ------------------------------------------------------------


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _number(var: Var, raw: str) -> int | float:
    name = var.name
    try:
        value: int | float = int(raw) if var.parse == "int" else float(raw)
    except ValueError:
        what = "a whole number" if var.parse == "int" else "a number"
        raise ConfigurationError(f"{name} must be {what}, got {raw!r}") from None
    lo, hi = var.lo, var.hi
    if lo is not None and hi is not None and not lo <= value <= hi:
        if var.parse == "int":
            lo, hi = int(lo), int(hi)
        raise ConfigurationError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _duration(var: Var, raw: str) -> int:
    """``5d``, ``36h``, ``90m``, ``3600s``: ASCII digits and one unit, nothing else."""
    match = _DURATION.fullmatch(raw)
    if match is None:
        raise ConfigurationError(f"{var.name} must be a whole number and a unit (s, m, h or d), "
                                 f"such as 5d or 36h; got {raw!r}")
    value = int(match[1]) * _UNIT_S[match[2]]
    if var.lo is not None and var.hi is not None and not var.lo <= value <= var.hi:
        raise ConfigurationError(f"{var.name} must be between {int(var.lo)} s and {int(var.hi)} s"
                                 f" ({_days(var.lo)} to {_days(var.hi)}), got {raw}")
    return value


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} d" if seconds >= 86400 else f"{seconds / 3600:g} h"


def _url(var: Var, raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in var.schemes:
        raise ConfigurationError(f"{var.name} must start with one of {', '.join(var.schemes)}://")
    if parts.scheme in ("http", "https", "redis", "rediss") and not parts.hostname:
        raise ConfigurationError(f"{var.name} has no host: {raw!r}")
    return raw.rstrip("/") if var.strip_slash else raw


def _text(var: Var, raw: str) -> str:
    if len(raw) < var.min_length:
        raise ConfigurationError(f"{var.name} must be at least {var.min_length} characters")
    if var.printable_ascii and not (raw.isascii() and raw.isprintable()):
        raise ConfigurationError(f"{var.name} must be printable ASCII")
    return raw


def read_field(field: str, env: Mapping[str, str] | None = None) -> Any:
    """One field as ``from_env`` reads it (its default when unset), without the others."""
    value = _read(os.environ if env is None else env, fields()[field])
    return Settings._field_defaults[field] if value is None else value


def _read(env: Mapping[str, str], var: Var) -> Any:
    """The parsed value, or None when the variable is unset (the field keeps its default)."""
    if var.parse == "raw":
        return env.get(var.name)
    if var.parse == "list":
        items = tuple(s.strip() for s in (env.get(var.name) or "").split(","))
        items = tuple(s for s in items if s)
        if any(len(s) < var.min_length for s in items):
            raise ConfigurationError(
                f"each {var.name} entry must be at least {var.min_length} characters")
        return items or None
    raw = _str(env, var.name)
    if raw is None:
        return None
    if var.parse in ("int", "float"):
        return _number(var, raw)
    if var.parse == "duration":
        return _duration(var, raw)
    if var.parse == "url":
        return _url(var, raw)
    if var.parse == "bool":
        if raw.lower() not in ("true", "false"):
            raise ConfigurationError(f"{var.name} must be true or false, got {raw!r}")
        return raw.lower() == "true"
    if var.parse == "choice":
        if raw not in var.choices:
            options = " or ".join(", ".join(repr(c) for c in var.choices).rsplit(", ", 1))
            raise ConfigurationError(f"{var.name} must be {options}, got {raw!r}")
        return raw
    return _text(var, raw)


# --- rules between fields ------------------------------------------------------------


def _upstash_pair(values: dict[str, Any]) -> None:
    if bool(values.get("upstash_redis_rest_url")) != bool(values.get("upstash_redis_rest_token")):
        raise ConfigurationError(
            "UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN must be set together")


def _one_redis(values: dict[str, Any]) -> None:
    if values.get("redis_url") and values.get("upstash_redis_rest_url"):
        raise ConfigurationError("set either SLUICE_REDIS_URL or UPSTASH_REDIS_REST_URL, not both")


def _smtp_sender(values: dict[str, Any]) -> None:
    if values.get("smtp_host") and not values.get("smtp_from"):
        raise ConfigurationError("SLUICE_SMTP_FROM must be set when SLUICE_SMTP_HOST is")


def _smtp_login(values: dict[str, Any]) -> None:
    if bool(values.get("smtp_username")) != bool(values.get("smtp_password")):
        raise ConfigurationError("SLUICE_SMTP_USERNAME and SLUICE_SMTP_PASSWORD must be set together")


def _proxies(values: dict[str, Any]) -> None:
    for entry in values.get("trusted_proxies", ()):
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigurationError(f"SLUICE_TRUSTED_PROXIES: {entry!r} is not an IP address "
                                     "or CIDR range") from None



def _webhook_secrets(values: dict[str, Any]) -> None:
    from sluice.core.webhooks import key_of

    for number, secret in enumerate(values.get("webhook_signing_secrets") or (), 1):
        try:
            key_of(secret)
        except ValueError as exc:
            raise ConfigurationError(
                f"SLUICE_WEBHOOK_SIGNING_SECRET entry {number}: {exc}") from None


RULES: tuple[Callable[[dict[str, Any]], None], ...] = (
    _upstash_pair, _one_redis, _smtp_sender, _smtp_login, _proxies, _webhook_secrets)
