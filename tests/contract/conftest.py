"""Contract tests: behaviour pinned against "an API server URL".

The ``api`` fixture is parametrised over three targets:

* ``emulator``: a fresh in-process emulator (always runs);
* ``apiserver``: upstream's real control plane built by ``make control-plane`` (marker
  ``apiserver``; one per session, see ``tests/cluster/``);
* ``cluster``: the cluster ``KUBECONFIG`` points at, only when ``BIAXIAL_CONTRACT_REAL=1`` is
  also set; otherwise skipped with that reason (never silently passed).

Each test gets its own namespace (``contract-<random>``) and cluster-scoped objects carry
the test's unique prefix (``api.name("...")``); everything is deleted afterwards, so the tests
are safe on a shared cluster. Tests that drive a capability only the emulator has (compacting
the watch history, fast bookmarks) are listed in ``EMULATOR_ONLY`` with the reason: they are
generated for the ``emulator`` target alone, never skipped at run time on the others.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from kubeapi import codec
from tests.emulator import Emulator

REAL_ENV = "BIAXIAL_CONTRACT_REAL"

#: Contract tests that drive an emulator-only hook or a deliberate emulator difference, by
#: test name, with the reason. Only their ``emulator`` case is generated.
EMULATOR_ONLY: dict[str, str] = {
    "test_watch_from_a_compacted_rv_is_an_error_410": (
        "compacts the watch history on demand (Emulator.compact); the real watch cache keeps "
        "every event since its start until its capacity is exceeded"
    ),
    "test_expired_continue_token_is_410": (
        "compacts on demand (Emulator.compact); the real server's continue tokens expire with "
        "etcd compaction, every 5 minutes"
    ),
    "test_bookmarks_carry_the_current_resource_version": (
        "a 0.2 s bookmark interval (@pytest.mark.emulator(bookmark_interval=...)); the real "
        "server sends bookmarks about once a minute"
    ),
    "test_apply_patch_is_unsupported_media_type": (
        "deliberate: the emulator refuses server-side apply (415), which the real server serves"
    ),
}

TARGETS = ("emulator", "apiserver", "cluster")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``api`` over the targets; an ``EMULATOR_ONLY`` test gets the emulator."""
    if "api" not in metafunc.fixturenames:
        return
    only = metafunc.function.__name__ in EMULATOR_ONLY
    metafunc.parametrize(
        "api",
        [
            pytest.param(t, marks=[pytest.mark.apiserver] if t == "apiserver" else [], id=t)
            for t in TARGETS
            if t == "emulator" or not only
        ],
        indirect=True,
    )


class Response:
    """A raw answer: status code, parsed JSON body (or None) and headers."""

    def __init__(self, status: int, body: Any, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @property
    def reason(self) -> str:
        return str((self.body or {}).get("reason", ""))

    def __repr__(self) -> str:
        return f"Response({self.status}, {codec.dumps(self.body)[:500]!r})"


class WatchStream:
    """An open watch read by a background thread; events arrive on a queue."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        try:
            for chunk in self._response.stream(65536, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self.events.put(codec.loads(line))
        except Exception:  # noqa: BLE001 - an aborted stream ends like a closed one
            pass
        finally:
            self.events.put(None)

    def next(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next event; None when the stream ended. Raises queue.Empty on timeout."""
        return self.events.get(timeout=timeout)

    def take(
        self, count: int, timeout: float = 5.0, *, skip_bookmarks: bool = True
    ) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event is None:
                break
            if skip_bookmarks and event["type"] == "BOOKMARK":
                continue
            got.append(event)
        return got

    def rest(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every event until the server ends the stream."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event is None:
                return got
            got.append(event)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._response.shutdown()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._response.release_conn()


class Api:
    """Raw HTTP plus the official client, against one API server, in one test namespace."""

    def __init__(self, api_client: Any, emulator: Emulator | None) -> None:
        self.client = api_client
        self.emulator = emulator
        self.base = api_client.configuration.host.rstrip("/")
        self.suffix = uuid.uuid4().hex[:6]
        self.namespace = f"contract-{self.suffix}"
        self._streams: list[WatchStream] = []
        self._cluster_objects: list[str] = []

    @functools.cached_property
    def minor(self) -> int:
        """The server's Kubernetes minor release (``/version``), for rules that changed."""
        return int(str(self.ok(self.get("/version"))["minor"]).rstrip("+"))

    def warnings(self, response: Response) -> list[str]:
        """The texts of a response's ``Warning`` headers (RFC 7234: ``299 - "text"``, the text
        quoted with ``\\`` and ``"`` escaped; several headers arrive joined by commas)."""
        raw = response.headers.get("warning", "")
        return [
            re.sub(r"\\(.)", r"\1", text)
            for text in re.findall(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"', raw)
        ]

    def name(self, base: str) -> str:
        """A cluster-unique name for a cluster-scoped object (cleaned up afterwards)."""
        return f"{base}-{self.suffix}"

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        auth = self.client.configuration.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = "application/json",
        query: dict[str, Any] | None = None,
    ) -> Response:
        url = self.base + path + (("?" + urlencode(query)) if query else "")
        data = body if isinstance(body, bytes) or body is None else codec.dumps(body)
        if method == "POST" and isinstance(body, dict):
            self._remember_cluster_scoped(path, body)
        resp = self.client.rest_client.pool_manager.request(
            method,
            url,
            body=data,
            headers=self._headers(content_type if data is not None else None),
            preload_content=True,
            timeout=30,
        )
        raw = resp.data
        try:
            parsed = codec.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Response(resp.status, parsed, {k.lower(): v for k, v in resp.headers.items()})

    def _remember_cluster_scoped(self, path: str, body: dict[str, Any]) -> None:
        """Note a cluster-scoped object (a POST to ``/api/v1/<plural>`` or
        ``/apis/<group>/<version>/<plural>``) so that teardown deletes it."""
        parts = [p for p in path.split("/") if p]
        collection = (parts[0] == "api" and len(parts) == 3) or (
            parts[0] == "apis" and len(parts) == 4
        )
        name = (body.get("metadata") or {}).get("name")
        if collection and name:
            self._cluster_objects.append(f"{path}/{name}")

    def get(self, path: str, **query: Any) -> Response:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any, **query: Any) -> Response:
        return self.request("POST", path, body, query=query or None)

    def put(self, path: str, body: Any) -> Response:
        return self.request("PUT", path, body)

    def patch(
        self, path: str, body: Any, content_type: str = "application/merge-patch+json"
    ) -> Response:
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: Any = None) -> Response:
        return self.request("DELETE", path, body)

    def ok(self, response: Response, *codes: int) -> dict[str, Any]:
        assert response.status in (codes or (200, 201)), response
        assert isinstance(response.body, dict)
        return response.body

    def watch(self, path: str, **query: Any) -> WatchStream:
        query = {"watch": "true", **query}
        url = self.base + path + "?" + urlencode(query)
        resp = self.client.rest_client.pool_manager.request(
            "GET",
            url,
            headers=self._headers(None),
            preload_content=False,
            timeout=None,
            retries=False,
        )
        stream = WatchStream(resp)
        self._streams.append(stream)
        return stream

    # convenience paths
    @property
    def ns_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}"

    def pods(self, name: str = "") -> str:
        return f"{self.ns_path}/pods" + (f"/{name}" if name else "")

    def claims(self, name: str = "") -> str:
        return f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims" + (
            f"/{name}" if name else ""
        )

    @staticmethod
    def slices(name: str = "") -> str:
        return "/apis/resource.k8s.io/v1/resourceslices" + (f"/{name}" if name else "")

    def setup(self) -> None:
        self.ok(
            self.post(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
            )
        )

    def teardown(self) -> None:
        for stream in self._streams:
            stream.close()
        for path in self._cluster_objects:
            self.request("DELETE", path)
            # strip finalizers so nothing is left behind on a real cluster
            self.request(
                "PATCH",
                path,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
        self.request("DELETE", f"/api/v1/namespaces/{self.namespace}")


def _real_cluster_client() -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    from kubernetes import client

    emulator: Emulator | None = None
    if request.param == "apiserver":
        plane = request.getfixturevalue("control_plane")
        api_client = client.ApiClient(plane.client_configuration())
    elif request.param == "cluster":
        if not os.environ.get("KUBECONFIG") or os.environ.get(REAL_ENV) != "1":
            pytest.skip(f"real-cluster contract run needs KUBECONFIG and {REAL_ENV}=1")
        api_client = _real_cluster_client()
    else:
        marker = request.node.get_closest_marker("emulator")
        emulator = Emulator(**(marker.kwargs if marker else {})).start()
        api_client = client.ApiClient(emulator.client_configuration())
    target = Api(api_client, emulator)
    try:
        target.setup()
        yield target
    finally:
        try:
            target.teardown()
        finally:
            api_client.close()
            if emulator is not None:
                emulator.stop()
                assert not emulator.internal_errors, emulator.internal_errors


def needs_emulator(api: Api) -> Emulator:
    """The emulator behind ``api``, for a test listed in ``EMULATOR_ONLY`` (only generated
    for the emulator target)."""
    assert api.emulator is not None, "a test that drives an emulator hook: add it to EMULATOR_ONLY"
    return api.emulator


def pod(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }
    body["spec"].update(spec)
    return body


def resource_slice(
    name: str, node: str, *, driver: str = "gpu.contract.example.com", devices: int = 1, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"model": {"string": "T4"}},
                    "capacity": {"memory": {"value": "16Gi"}},
                }
                for i in range(devices)
            ],
        },
    }
    body["spec"].update(spec)
    return body


def claim(
    name: str, *, count: int = 1, device_class: str = "gpu.contract.example.com"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}
                ]
            }
        },
    }
