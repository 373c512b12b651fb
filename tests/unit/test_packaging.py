"""One installable import name, ``sluice`` (source root ``shared/``), in an editable install
and in the layout a wheel installs; ``functions/`` is the deployment's, not the package's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from setuptools import find_packages

from tests.conftest import ROOT

PROBE = ("import sluice, sluice.store.db as m; "
         "print(sluice.__file__); print(sorted(sluice.__all__) == sorted(set(sluice.__all__))); "
         "print(all(hasattr(sluice, n) for n in sluice.__all__)); "
         "print(bool(m.load_queries('delivery'))); "
         "print('fastapi' in sys.modules)")


def _setuptools() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"]
    return config


def test_one_import_name_and_every_package_under_it() -> None:
    found = find_packages(str(ROOT / "shared"))
    assert found and all(p == "sluice" or p.startswith("sluice.") for p in found), found
    assert (ROOT / "functions").is_dir() and "functions" not in found
    assert _setuptools()["packages"]["find"] == {  # type: ignore[index]
        "where": ["shared"], "include": ["sluice", "sluice.*"]}


def test_the_lazy_names_are_the_public_modules_names() -> None:
    import sluice
    import sluice.public

    assert sluice.__all__ == sluice.public.__all__
    assert all(getattr(sluice, n) is getattr(sluice.public, n) for n in sluice.__all__)


def test_sluice_imports_from_the_editable_install(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; " + PROBE], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=True)
    where, unique, complete, sql, web = done.stdout.split()
    assert Path(where) == ROOT / "shared" / "sluice" / "__init__.py"
    assert (unique, complete, sql) == ("True", "True", "True")
    assert web == "False", "the app's API imports no web framework"


def test_sluice_imports_from_the_layout_a_wheel_installs(tmp_path: Path) -> None:
    # What a non-editable install puts in site-packages: every listed package from its
    # (mapped) directory, with the package data, and nothing else of the checkout.
    config = _setuptools()
    data: dict[str, list[str]] = config["package-data"]  # type: ignore[assignment]
    source_root = ROOT / "shared"
    target = tmp_path / "site"
    for package in find_packages(str(source_root)):
        source = source_root.joinpath(*package.split("."))
        dest = target.joinpath(*package.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            shutil.copy(module, dest / module.name)
    for package, patterns in data.items():
        for pattern in patterns:
            for path in (source_root / package).glob(pattern):
                dest = target / package / path.relative_to(source_root / package)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest)
    # -S: no .pth files, so the editable finder that maps onto the checkout is not loaded;
    # the third-party dependencies still come from the environment's site-packages.
    code = (f"import sys; sys.path[:0] = [{str(target)!r}, "
            f"{sysconfig.get_paths()['purelib']!r}]; " + PROBE)
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    where, unique, complete, sql, web = done.stdout.split()
    assert Path(where) == target / "sluice" / "__init__.py"
    assert (unique, complete, sql, web) == ("True", "True", "True", "False")
