"""One action name per action: what the command line and the DLQ tooling write to the
audit trail is the name of the API route that does the same thing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute

from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.http.app import AUDITED_METHODS, create_app
from sluice.store.db import open_database

SHARED = Path(__file__).resolve().parents[3] / "shared" / "sluice"
ACTION = re.compile(r'"((?:dlq|flags|erasure|delivery):[a-z_]+)"')


def _route_actions(tmp_path: Path) -> set[str]:
    settings = Settings.from_env({"SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/a.db"})
    services = Services(settings, open_database(settings.database_url), Reporter())
    app = create_app(services)
    services.close()
    found: set[str] = set()
    stack: list[Any] = list(app.routes)
    while stack:
        route = stack.pop()
        if isinstance(route, APIRoute) and route.methods & AUDITED_METHODS:
            found.add(route.name)
        stack.extend(getattr(getattr(route, "original_router", None), "routes", []))
    assert "flags:set" in found and "state-cleanup:admin" in found
    return found


def test_actions_written_outside_the_api_are_api_route_names(tmp_path: Path) -> None:
    routes = _route_actions(tmp_path)
    written = {name for folder in ("cli", "ops", "store")
               for path in (SHARED / folder).glob("*.py")
               for name in ACTION.findall(path.read_text())}
    assert written, "the scan found the actions"
    assert written - routes == set()
