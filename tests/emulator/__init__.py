"""A faithful Kubernetes API server emulator for the test suite (test infrastructure only).

Real HTTP/1.1 on 127.0.0.1 that the official ``kubernetes`` client, kubectl and the project's
own processes talk to as they would to a cluster: one global resourceVersion, optimistic
concurrency, watch with history/410/bookmarks, selectors, pagination, status subresources,
pod binding, finalizers, strict schema validation plus DRA semantic checks, test hooks and
fault injection. See ``tests/emulator/README.md`` for the supported surface and deviations.

Use in-process (``with Emulator() as api: ...`` or the ``emulator`` pytest fixture) or as a
process: ``python -m tests.emulator --port 0 --kubeconfig FILE``.
"""

from tests.emulator.claims import ResourceClaimController
from tests.emulator.errors import ApiStatusError
from tests.emulator.faults import RequestRecord
from tests.emulator.kinds import ALL_KINDS, Kind, lookup
from tests.emulator.server import Emulator, write_kubeconfig
from tests.emulator.volumes import VolumeController

__all__ = [
    "ALL_KINDS",
    "ApiStatusError",
    "Emulator",
    "Kind",
    "RequestRecord",
    "ResourceClaimController",
    "VolumeController",
    "lookup",
    "write_kubeconfig",
]
