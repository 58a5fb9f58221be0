"""Suite-wide pytest configuration. Layer-specific fixtures live next to their tests; the API
emulator's fixtures come from its pytest plugin."""

pytest_plugins = ["tests.emulator.pytest_plugin"]
