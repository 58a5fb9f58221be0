"""pytest fixtures for the real control plane (marker ``apiserver``).

``control_plane`` starts one control plane for the whole session (etcd, kube-apiserver,
kube-controller-manager) the first time a test asks for it, and stops and removes it when the
session ends, failed tests and Ctrl-C included. Without binaries the tier is skipped with one
reason locally, and fails in CI (``CI`` set), where ``make control-plane`` must have run.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator

import pytest

from tests.cluster.build import release
from tests.cluster.controlplane import ControlPlane


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the real control plane is required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane(release())
    atexit.register(plane.stop)  # the interpreter exiting some other way
    try:
        plane.start()
    except FileNotFoundError as err:
        plane.stop()
        _unavailable(str(err))
    try:
        yield plane
    finally:
        plane.stop()
