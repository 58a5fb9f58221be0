"""pytest fixtures for the API emulator (registered in ``tests/conftest.py``).

* ``emulator``: a fresh, running in-process :class:`~tests.emulator.Emulator` per test,
  stopped (watches ended, connections closed) at teardown. A test that hit an emulator bug
  (an internal 500) fails at teardown.
* ``api_client``: a ``kubernetes.client.ApiClient`` configured for it (closed at teardown).
* ``kubeconfig``: path of a kubeconfig file for it, for subprocesses and ``kubernetes.config``.
* ``claim_controller``: a running :class:`~tests.emulator.ResourceClaimController`.
* ``volume_controller``: a running :class:`~tests.emulator.VolumeController` (PV controller,
  external-provisioner for ``csi.test.biaxial.dev``, ephemeral volume controller).

When a test that used ``emulator`` fails, the API's failed requests and last calls are printed
(pytest shows them with the failure).

Options: mark a test ``@pytest.mark.emulator(node_identity="n1", history_size=10)`` to pass
constructor arguments to the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported lazily: a session that uses no fixture pays nothing
    from tests.emulator.claims import ResourceClaimController
    from tests.emulator.server import Emulator
    from tests.emulator.volumes import VolumeController

_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


def _explain_failure(api: Emulator) -> None:
    """On a failed test, print what the API saw: failed requests and the last few calls."""
    records = list(api.requests)
    failed = [r for r in records if r.status >= 400]
    lines = [f"API emulator: {len(records)} requests, {len(failed)} answered with an error"]
    lines += [f"  ERROR {r.status} {r.method} {r.path} {r.query or ''}" for r in failed[-20:]]
    lines += ["  last requests:"] + [
        f"  {r.status} {r.method} {r.path} {r.query or ''}" for r in records[-15:]
    ]
    print("\n".join(lines))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "emulator(**kwargs): constructor arguments for the `emulator` fixture"
    )


@pytest.fixture
def emulator(request: pytest.FixtureRequest) -> Iterator[Emulator]:
    from tests.emulator.server import Emulator

    marker = request.node.get_closest_marker("emulator")
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker else {}
    api = Emulator(**kwargs).start()
    try:
        yield api
    finally:
        api.stop()
        report = request.node.stash.get(_CALL_REPORT, None)
        if report is not None and report.failed:
            _explain_failure(api)
    if api.internal_errors:
        pytest.fail(f"the emulator hit internal errors: {api.internal_errors!r}")


@pytest.fixture
def api_client(emulator: Emulator) -> Iterator[Any]:
    from kubernetes import client

    api = client.ApiClient(emulator.client_configuration())
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path) -> Path:
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def claim_controller(emulator: Emulator) -> Iterator[ResourceClaimController]:
    from tests.emulator.claims import ResourceClaimController

    controller = ResourceClaimController(emulator).start()
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture
def volume_controller(emulator: Emulator) -> Iterator[VolumeController]:
    from tests.emulator.volumes import VolumeController

    controller = VolumeController(emulator).start()
    try:
        yield controller
    finally:
        controller.stop()
    assert not controller.failures, controller.failures
