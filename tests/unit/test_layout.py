"""The project's layout rules that import-linter cannot state: one logger root, and a core
that holds no application code."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from pathlib import Path

import pytest

PACKAGES = ("driver", "kubeapi", "kubeletplugin", "controller", "biaxial")
ROOT = Path(__file__).resolve().parents[2]


def _all_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            if ".proto.gen" in info.name or info.name.endswith("__main__"):
                continue
            names.append(info.name)
    return names


def test_every_logger_is_under_biaxial() -> None:
    """One setting (``logging.getLogger("biaxial")``) reaches every line the program logs."""
    for name in _all_modules():
        importlib.import_module(name)
    ours = [
        name
        for name in logging.Logger.manager.loggerDict
        if name.split(".")[0] in PACKAGES and name != "biaxial"
    ]
    strays = [name for name in ours if not name.startswith("biaxial.")]
    assert not strays, f"loggers outside biaxial.: {strays}"
    assert "biaxial.driver.scheduling.decision" in ours
    assert "biaxial.controller.scheduler" in ours
    assert "biaxial.kubeletplugin.prepare" in ours


@pytest.mark.parametrize("band", ["api", "cel", "discovery", "structured", "scheduling"])
def test_the_core_is_in_bands(band: str) -> None:
    assert (ROOT / "driver" / band / "__init__.py").is_file()


def test_the_core_has_no_application_code() -> None:
    """Reading manifests and drawing pictures belong to the simulator, not to the core (the
    fake GPU profiles are discovery's own data and the one file the core reads)."""
    offenders = []
    for path in sorted((ROOT / "driver").rglob("*.py")):
        text = path.read_text()
        if "matplotlib" in text or "load_objects" in text or "argparse" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders
    top_level = sorted(p.name for p in (ROOT / "driver").glob("*.py"))
    assert top_level == ["__init__.py"], "every module of the core belongs to a band"
