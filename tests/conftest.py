"""Suite-wide pytest configuration. Layer-specific fixtures live next to their tests; the API
emulator's fixtures come from its pytest plugin, the real control plane's from
tests/cluster/pytest_plugin.py."""

pytest_plugins = ["tests.emulator.pytest_plugin", "tests.cluster.pytest_plugin"]
