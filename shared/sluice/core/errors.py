"""One error tree for Sluice.

Each class's docstring is its default message. Driver errors are translated at
the store boundary (``sluice.store.db``) into ``TransientStoreError`` or
``PermanentStoreError``; callers branch on types, never on message text.
"""

from __future__ import annotations

from typing import Any


class SluiceError(Exception):
    """Sluice failed."""

    code = "error"
    status = 500

    def __init__(self, message: str | None = None, **context: Any) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.context = context

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.context}}


class ConfigurationError(SluiceError):
    """Sluice is misconfigured."""

    code = "configuration_error"


class ShutdownRequested(SluiceError):
    """The process is shutting down: the wait was cut short."""

    code = "shutdown_requested"
    status = 503


class StoreError(SluiceError):
    """A store operation failed."""

    code = "store_error"


class TransientStoreError(StoreError):
    """The store is unreachable or busy; the same operation may succeed later."""

    code = "store_unavailable"
    status = 503


class PermanentStoreError(StoreError):
    """The store rejected the operation; repeating it will not help."""


class ConstraintViolation(PermanentStoreError):
    """The write broke a constraint of the schema."""

    code = "constraint_violation"
    status = 409


class UpstreamUnavailable(SluiceError):
    """A service Sluice depends on did not answer; try again later."""

    code = "upstream_unavailable"
    status = 503


class RequestError(SluiceError):
    """The request is invalid."""

    code = "bad_request"
    status = 400


class Unauthorized(RequestError):
    """Authentication is required."""

    code = "unauthorized"
    status = 401


class Forbidden(RequestError):
    """This identity may not do that."""

    code = "forbidden"
    status = 403


class NotFound(RequestError):
    """No such thing."""

    code = "not_found"
    status = 404


class Conflict(RequestError):
    """The thing is not in a state that allows this."""

    code = "conflict"
    status = 409


class UnknownJob(NotFound):
    """No job has that name."""

    code = "unknown_job"


class LeaseLost(SluiceError):
    """This run no longer holds its job's lease; it stopped before its next side effect."""

    code = "lease_lost"
    status = 409
