"""The dependencies a job or a route needs, built once per process (module scope in Lambda)."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from sluice.core.observe import Reporter
from sluice.core.settings import Settings
from sluice.store.db import PgOptions, PostgresDatabase, SqliteDatabase, open_database

if TYPE_CHECKING:
    from sluice.core.auth import AdminVerifier
    from sluice.store.state import StateStore


def pg_options(settings: Settings) -> PgOptions:
    return PgOptions(connect_timeout_s=settings.database_connect_timeout_s,
                     statement_timeout_s=settings.database_statement_timeout_s,
                     prepared_statements=settings.database_prepared_statements,
                     # a delivery drain's concurrent sends each hold a transaction at times
                     pool_size=max(4, settings.delivery_drain_concurrency + 1))


class Services:
    def __init__(self, settings: Settings, db: SqliteDatabase | PostgresDatabase,
                 reporter: Reporter | None = None, redis: Any = None) -> None:
        self.settings = settings
        self.db = db
        self.reporter = reporter or Reporter(sentry_dsn=settings.sentry_dsn,
                                             environment=settings.stage)
        if redis is not None:
            self.__dict__["redis"] = redis

    @classmethod
    def from_settings(cls, settings: Settings) -> Services:
        return cls(settings, open_database(settings.database_url, pg_options(settings)))

    @classmethod
    def from_env(cls) -> Services:
        return cls.from_settings(Settings.from_env())

    @cached_property
    def state(self) -> StateStore:
        from sluice.store.state import StateStore

        return StateStore(self.db)

    @cached_property
    def admin(self) -> AdminVerifier:
        from sluice.core.auth import AdminVerifier

        return AdminVerifier(self.settings)

    @cached_property
    def redis(self) -> Any:
        """The Redis client (redis-py over TCP or upstash-redis over REST), or None if unset."""
        if not self.settings.redis_configured:
            return None
        from sluice.store.redis_clients import connect

        return connect(self.settings)

    @cached_property
    def cloudwatch(self) -> Any:
        """A CloudWatch client (boto3), built at its first use: the queue cards' oldest age."""
        import boto3  # type: ignore[import-untyped]

        return boto3.client("cloudwatch")

    @cached_property
    def lambda_client(self) -> Any:
        """A Lambda client (boto3), built at its first use: the console's job hand-off."""
        import boto3
        from botocore.config import Config  # type: ignore[import-untyped]

        # boto3 reads AWS_ENDPOINT_URL_LAMBDA / AWS_ENDPOINT_URL itself.
        return boto3.client("lambda", config=Config(
            retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5,
            read_timeout=10))

    def close(self) -> None:
        redis = self.__dict__.get("redis")  # only if it was ever built
        if redis is not None and hasattr(redis, "close"):
            redis.close()
        self.db.close()
