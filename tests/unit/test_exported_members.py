"""The public surface, pinned: ``sluice`` (the app's calls) and ``sluice.extend`` (its
declarations, and what its drains, handlers and adapters need). A name added or dropped
fails here first; every name resolves, is typed, is documented in docs/api.md, and the
example app imports from these two modules alone."""

from __future__ import annotations

import ast
import re

import sluice
import sluice.extend
from tests.conftest import ROOT

SLUICE = [
    "ConfigurationError", "DeliveryEntry", "DeliveryStatus", "ErasureRequest",
    "PermanentStoreError", "Published", "RequestError", "Services", "Settings", "Signer",
    "SluiceError", "TransientStoreError", "UsageEntry", "canonical", "connect",
    "enqueue_deliveries", "enqueue_delivery", "publish", "record_usage", "request_erasure", "verify_webhook",
]
EXTEND = [
    "NO_PROGRESS", "SURFACE_ROLES", "Answer", "Channel", "ChannelAdapter", "Deadline",
    "DeliveryEntry", "Egress", "EgressError", "Handler", "InboundMessage", "Job", "JobContext",
    "Message", "MessageField", "Outbound", "OutcomeUnknown", "Param", "PermanentDeliveryError",
    "Progress", "RequestError", "Result", "Retrier", "Services", "Settings", "Surface", "Topic",
    "TransientDeliveryError", "message_of", "refused", "transport_error",
]
APP = ROOT / "docs" / "examples" / "exampleapp"
PUBLIC = {"sluice", "sluice.extend"}


def test_the_exported_members_are_pinned() -> None:
    assert sluice.__all__ == SLUICE
    assert sluice.extend.__all__ == EXTEND
    assert set(sluice.extend._SOURCES) == set(EXTEND)


def test_every_exported_name_resolves_from_its_module() -> None:
    for module in (sluice, sluice.extend):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
        assert set(module.__all__) <= set(dir(module))
    # the same object under both names where both modules export it
    for name in set(SLUICE) & set(EXTEND):
        assert getattr(sluice, name) is getattr(sluice.extend, name), name


def test_the_package_is_typed() -> None:
    assert (ROOT / "shared" / "sluice" / "py.typed").is_file()
    package_data = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^sluice = \["py\.typed"', package_data, re.MULTILINE)


def test_docs_api_documents_exactly_the_public_names() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    sections = dict(re.findall(r"^## `([\w.]+)`\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE))
    assert set(sections) == PUBLIC
    for module, names in (("sluice", SLUICE), ("sluice.extend", EXTEND)):
        documented = re.findall(r"^### `(\w+)`$", sections[module], re.MULTILINE)
        assert sorted(documented) == sorted(names), module


def _imports(path: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse((APP / path).read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            if node.module == "sluice.extend":
                missing = {a.name for a in node.names} - set(EXTEND)
                assert not missing, (path, missing)
    return found


def test_the_example_app_imports_only_the_public_modules() -> None:
    sources = sorted(str(p.relative_to(APP)) for p in APP.rglob("*.py"))
    assert "exampleapp/pager.py" in sources and "exampleapp/sluice_ext.py" in sources
    for path in sources:
        of_sluice = {name for name in _imports(path) if name.split(".")[0] == "sluice"}
        assert of_sluice <= PUBLIC, (path, of_sluice - PUBLIC)
