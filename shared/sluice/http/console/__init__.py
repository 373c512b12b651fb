"""The operations console: pages under ``/admin``, their JSON twins, its own static assets."""

from sluice.http.console.pages import router

__all__ = ["router"]
