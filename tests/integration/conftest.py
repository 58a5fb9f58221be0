"""Fixtures shared by the integration tests that drive a controller against the API emulator.

A test file seeds its cluster in its own ``cluster`` fixture; ``controller`` runs a checked
controller on it (:func:`tests.integration.controller_env.checked_controller`). A file that needs
another controller (a subprocess, a preemption-aware check) defines its own ``controller``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.emulator import Emulator
from tests.integration.controller_env import ControllerThread, checked_controller


@pytest.fixture
def controller(cluster: Emulator) -> Iterator[ControllerThread]:
    with checked_controller(cluster) as running:
        yield running
