"""Opt-in end-to-end tests against a real cluster with biaxial installed (``make e2e-kind``).

They run only when ``BIAXIAL_E2E=1`` and ``kubectl`` reaches a cluster (``$KUBECONFIG``, else
the kubeconfig ``deploy/kind/up.sh`` writes). Otherwise every test here is *skipped with the
reason* (shown by ``pytest -rs``), never passed silently: a run without a container engine or
a cluster says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

KIND_KUBECONFIG = Path(tempfile.gettempdir()) / "biaxial-kind.kubeconfig"
NAMESPACE = "biaxial-system"


def _container_engine() -> str | None:
    for engine in ("docker", "podman"):
        if shutil.which(engine) is None:
            continue
        ok = subprocess.run([engine, "info"], capture_output=True, timeout=30, check=False)
        if ok.returncode == 0:
            return engine
    return None


def _why_not() -> tuple[str | None, str | None]:
    """(reason to skip, kubeconfig to use)."""
    if os.environ.get("BIAXIAL_E2E") != "1":
        reason = (
            "e2e tests are opt-in: run `make e2e-kind` (kind + docker/podman), or set "
            "BIAXIAL_E2E=1 with KUBECONFIG pointing at a cluster that runs biaxial"
        )
        return reason, None
    if shutil.which("kubectl") is None:
        return "BIAXIAL_E2E=1 but kubectl is not on PATH", None
    kubeconfig = os.environ.get("KUBECONFIG") or (
        str(KIND_KUBECONFIG) if KIND_KUBECONFIG.is_file() else None
    )
    if kubeconfig is not None and not Path(kubeconfig).is_file():
        return (
            f"BIAXIAL_E2E=1 but KUBECONFIG {kubeconfig} does not exist: run deploy/kind/up.sh",
            None,
        )
    if kubeconfig is None:
        engine = _container_engine()
        if engine is None:
            reason = (
                "BIAXIAL_E2E=1 but there is no cluster: no KUBECONFIG, no kind kubeconfig at "
                f"{KIND_KUBECONFIG}, and no running container engine (docker/podman) to make one"
            )
            return reason, None
        return f"no cluster yet: run deploy/kind/up.sh ({engine} is available)", None
    probe = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"cluster of {kubeconfig} is not reachable: {probe.stderr.strip()[:200]}", None
    return None, kubeconfig


class Kubectl:
    """``kubectl`` against the e2e cluster, JSON in and out."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=110,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    mine = [i for i in items if Path(str(i.fspath)).is_relative_to(here)]
    if not mine:
        return
    reason, _ = _why_not()
    for item in mine:
        item.add_marker(pytest.mark.e2e)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    reason, kubeconfig = _why_not()
    if reason is not None or kubeconfig is None:
        pytest.skip(reason or "no cluster")
    return Kubectl(kubeconfig)
