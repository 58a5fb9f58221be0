"""Suite-wide pytest configuration. Layer-specific fixtures live next to their tests; the API
emulator's fixtures come from its pytest plugin, the real control plane's from
tests/cluster/pytest_plugin.py."""

from __future__ import annotations

import gc

import pytest

pytest_plugins = ["tests.emulator.pytest_plugin", "tests.cluster.pytest_plugin"]

# Layers whose tests open sockets, start event loops and run processes.
_NETWORK_LAYERS = ("apiserver", "contract", "e2e", "integration", "node")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A socket or subprocess left open is reported by the garbage collector whenever it runs:
    without this, the ResourceWarning (an error here) lands in whichever later test happens to
    trigger a full collection, often far from the leak. Collecting as each networked module
    ends pins the warning to that module's last test (milliseconds per module)."""
    if item.path.parent.name not in _NETWORK_LAYERS:
        return
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
