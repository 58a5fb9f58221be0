"""The live run of issue 26: the four sources' unchanged pods from docs/migration.md (KAI
``gpu-fraction: "0.5"``, HAMi ``nvidia.com/gpu`` + ``nvidia.com/gpumem`` with no scheduler
name, Volcano vGPU, the device plugin's ``nvidia.com/gpu: 2``) created in an opted-in
namespace of the real API server with the chart's admission step on, by either mechanism, and
``biaxial controller`` running as the chart runs it (its own ServiceAccount token and nothing
but the chart's RBAC; with ``admission.mechanism: webhook`` the same process serves the
webhook, as the Deployment does). Each ends bound by biaxial with its devices and its share,
as its claim's allocation shows; the same pods in a namespace outside the scope are stored as
written and biaxial never binds them.

The webhook is called at ``https://127.0.0.1:PORT`` with a CA this test makes instead of the
chart's Service (see tests/apiserver/test_admission.py). Run with ``-s`` to see each pod
before and after admission and what biaxial gave it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.api.quantity import parse_quantity
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests.admission_cases import CASES, OPT_IN_LABEL, OUT_OF_SCOPE, SOURCES, observed
from tests.apiserver.components import (
    DRIVER,
    RESOURCE,
    ControllerProcess,
    claims_path,
    create,
    delete,
    ensure_kwok,
    get,
    gpu_node,
    items,
    pod_path,
    sa_user,
    writers,
)
from tests.apiserver.conftest import ChartInstall
from tests.apiserver.test_admission import (
    MECHANISMS,
    _namespace,
    _wait_for_admission,
    pointed_at,
    rendered_admission,
    values_for,
)
from tests.cluster.controlplane import ControlPlane, free_port, make_pki, object_path
from tests.integration.fake_kubelet import wait
from tests.render_chart import render_objects

JSON = dict[str, Any]
NODE = "admission-live-t4"
ROOT = Path(__file__).resolve().parents[2]
#: one device result: (device, consumed memory, the device's whole memory, consumed cores)
Given = tuple[str, str, int, str | None]


def _webhook_args(values: JSON, port: int, cert: Path, key: Path) -> list[str]:
    """The ``--admission-*`` arguments the chart gives the controller with these values, the
    port and the certificate files replaced by the test's."""
    (deployment,) = [r.obj for r in render_objects(values) if r.kind == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    replace = {
        "--admission-webhook-port": str(port),
        "--admission-tls-cert-file": str(cert),
        "--admission-tls-private-key-file": str(key),
    }
    out = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag.startswith("--admission-"):
            out.append(f"{flag}={replace.get(flag, value)}")
    assert {a.partition("=")[0] for a in out} >= set(replace), out
    return [*out, "--admission-webhook-bind-address=127.0.0.1"]


@contextlib.contextmanager
def t4_nodes(plane: ControlPlane, *names: str) -> Iterator[None]:
    """Ready nodes kwok runs pods on, each with four fake T4s published as the plugin would."""
    ensure_kwok(plane)
    created: list[str] = []
    try:
        for name in names:
            node = gpu_node(plane, name)
            with open_backend("t4x4", node_name=name) as backend:
                gpus = backend.discover()
            slices = build_slices(
                gpus, node_name=name, driver_name=DRIVER, node_uid=node["metadata"]["uid"]
            )
            created.extend(
                create(plane, f"{RESOURCE}/resourceslices", s.to_api())["metadata"]["name"]
                for s in slices
            )
        yield
    finally:
        for name in created:
            delete(plane, f"{RESOURCE}/resourceslices/{name}")
        for name in names:
            delete(plane, f"/api/v1/nodes/{name}")


def _shown(pod: JSON) -> JSON:
    """What admission may change on a pod, and what the pod asked for: its annotations,
    scheduler name and each container's resources (as written, or as stored)."""
    spec = pod["spec"]
    out: JSON = {"metadata": {"name": pod["metadata"]["name"]}}
    if pod["metadata"].get("annotations"):
        out["metadata"]["annotations"] = dict(pod["metadata"]["annotations"])
    out["spec"] = {"schedulerName": spec.get("schedulerName", "(unset: default-scheduler)")}
    out["spec"]["containers"] = [
        {"name": c["name"], "resources": c.get("resources") or {}} for c in spec["containers"]
    ]
    return out


def _bound(plane: ControlPlane, namespace: str, name: str) -> JSON | None:
    stored = get(plane, pod_path(namespace, name)) or {}
    status = stored.get("status") or {}
    ext = status.get("extendedResourceClaimStatus") or {}
    if stored.get("spec", {}).get("nodeName") and ext.get("resourceClaimName"):
        return stored
    return None


def _allocation(plane: ControlPlane, namespace: str, stored: JSON) -> tuple[JSON, list[JSON]]:
    name = stored["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = get(plane, claims_path(namespace, name))
    assert claim is not None, name
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [stored["metadata"]["uid"]]
    return claim, results


def _device_memory(plane: ControlPlane, pool: str, device: str) -> int:
    for s in items(plane, f"{RESOURCE}/resourceslices"):
        if s["spec"]["pool"]["name"] == pool:
            for d in s["spec"].get("devices") or []:
                if d["name"] == device:
                    return _bytes(d["capacity"]["memory"]["value"])
    raise AssertionError(f"no device {pool}/{device}")


def _bytes(quantity: str) -> int:
    return parse_quantity(quantity).value()


@dataclass
class Live:
    """The admission step by one mechanism, biaxial's controller running, an opted-in
    namespace and one outside the scope."""

    install: ChartInstall
    mechanism: str
    inside: str
    outside: str
    report: list[str] = field(default_factory=list)

    @property
    def plane(self) -> ControlPlane:
        return self.install.plane

    def bound_with(self, name: str) -> tuple[JSON, JSON, list[Given]]:
        """Once ``name`` (in the opted-in namespace) is bound: the pod, its claim and each
        device result as (device, consumed memory, the device's whole memory, consumed
        cores)."""
        plane = self.plane
        stored = wait(lambda: _bound(plane, self.inside, name), timeout_s=120, what=f"{name} bound")
        claim, results = _allocation(plane, self.inside, stored)
        given = []
        for r in results:
            assert r["pool"] == stored["spec"]["nodeName"]
            assert r["driver"] == DRIVER
            consumed = r.get("consumedCapacity") or {}
            whole = _device_memory(plane, r["pool"], r["device"])
            given.append((r["device"], consumed["memory"], whole, consumed.get("cores")))
        assert (sa_user(self.install, "controller"), "create", "binding") in writers(
            plane, "pods", name, self.inside
        )
        return stored, claim, given

    def record(self, name: str, written: JSON, stored: JSON, bound: JSON, claim: JSON) -> None:
        results = claim["status"]["allocation"]["devices"]["results"]
        self.report.append(
            f"--- {name} ({self.mechanism}): as written\n"
            f"{yaml.safe_dump(_shown(written), sort_keys=False)}"
            f"--- {name}: as stored in {self.inside} (after admission)\n"
            f"{yaml.safe_dump(_shown(stored), sort_keys=False)}"
            f"--- {name}: bound to {bound['spec']['nodeName']} by biaxial; claim "
            f"{claim['metadata']['name']} allocation: "
            f"{[{k: r.get(k) for k in ('device', 'consumedCapacity')} for r in results]}"
        )

    def untouched(self, name: str, written: JSON, stored: JSON) -> None:
        """``stored`` (out of scope) is as written, and biaxial never binds it."""
        assert observed(stored) == observed(written)
        assert "biaxial.dev/admission" not in (stored["metadata"].get("annotations") or {})
        controller_user = sa_user(self.install, "controller")
        assert not [
            w for w in writers(self.plane, "pods", name, self.outside) if w[0] == controller_user
        ]
        assert not (get(self.plane, pod_path(self.outside, name)) or {})["spec"].get("nodeName")
        self.report.append(
            f"--- {name}: as stored in {self.outside} (out of scope)\n"
            f"{yaml.safe_dump(_shown(stored), sort_keys=False)}"
        )


@contextlib.contextmanager
def live(
    install: ChartInstall, root: Path, mechanism: str, label: str, *nodes: str
) -> Iterator[Live]:
    """The chart's admission step by ``mechanism`` (the webhook served by the controller
    process, as its Deployment does), the controller running and leading, T4 nodes; every
    pod, the step and the namespaces removed afterwards and the controller stopped, which
    must exit 0 without a traceback."""
    plane = install.plane
    inside, outside = f"admission-{label}", f"admission-{label}-out"
    values = values_for(mechanism, plane, label)
    objects = rendered_admission(values)
    controller = ControllerProcess(install, root, f"ctl-{label}")
    if mechanism == "webhook":
        pki = make_pki(root / "pki")
        port = free_port()
        controller.argv += _webhook_args(values, port, pki.serving_cert, pki.serving_key)
        (configuration,) = objects
        objects = [pointed_at(configuration, port, pki)]
    state = Live(install, mechanism, inside, outside)
    with t4_nodes(plane, *nodes):
        controller.start()
        try:
            wait(controller.leading, timeout_s=60, what="leadership")
            plane.apply(objects)
            _namespace(plane, inside, {OPT_IN_LABEL: label})
            _namespace(plane, outside, OUT_OF_SCOPE)
            _wait_for_admission(plane, inside)
            yield state
        finally:
            for namespace in (inside, outside):
                for p in items(plane, pod_path(namespace)):
                    plane.request(
                        "DELETE",
                        pod_path(namespace, p["metadata"]["name"]) + "?gracePeriodSeconds=0",
                    )
            wait(
                lambda: not items(plane, pod_path(inside)) and not items(plane, pod_path(outside)),
                timeout_s=60,
                what="the pods gone",
            )
            code = controller.stop()
            for obj in reversed(objects):
                plane.request("DELETE", object_path(obj))
            for namespace in (inside, outside):
                plane.request("DELETE", f"/api/v1/namespaces/{namespace}")
            print("\n" + "\n".join(state.report))
    log = controller.log()
    assert code == 0, log[-5000:]
    assert "Traceback" not in log, log[-5000:]
    if mechanism == "webhook":  # the controller's own webhook made the changes
        assert log.count("admission: ") >= 1, log[-5000:]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_tables_four_sources_end_bound_by_biaxial_with_their_shares(
    chart_install: ChartInstall, tmp_path: Path, mechanism: str
) -> None:
    """The table's pods for the four sources (KAI gpu-fraction 0.5; HAMi nvidia.com/gpu +
    gpumem 4000 and no scheduler name; Volcano vgpu-number 1 + vgpu-memory 2000; the device
    plugin's nvidia.com/gpu: 2)."""
    manifests = {
        name: copy.deepcopy(next(c for c in CASES if c.name == name).pod) for name in SOURCES
    }
    with live(chart_install, tmp_path, mechanism, f"live-{mechanism}", NODE) as state:
        plane = state.plane
        stored = {n: create(plane, pod_path(state.inside), b) for n, b in manifests.items()}
        given = {}
        for name in SOURCES:
            bound, claim, given[name] = state.bound_with(name)
            state.record(name, manifests[name], stored[name], bound, claim)
            assert observed(stored[name]).scheduler == "biaxial"
        for name, body in manifests.items():
            state.untouched(name, body, create(plane, pod_path(state.outside), body))
        # the shares: KAI half a T4, HAMi 4000 MiB, Volcano 2000 MiB, two whole GPUs
        ((_, kai, kai_whole, _),) = given["kai-fraction"]
        assert _bytes(kai) == kai_whole // 2
        assert [g[1] for g in given["hami"]] == ["4000Mi"]
        assert [g[1] for g in given["volcano"]] == ["2000Mi"]
        pair = given["device-plugin"]
        assert len({g[0] for g in pair}) == 2
        assert all(_bytes(m) == w for _, m, w, _ in pair)  # the whole memory: not shared


def _pods_of(path: Path) -> list[JSON]:
    """The pods a manifest makes: a Pod as written; a Deployment's ``replicas`` pods as its
    ReplicaSet creates them (the template's metadata and spec; no Deployment controller runs
    here). The namespace is the test's."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    if doc["kind"] == "Pod":
        body = copy.deepcopy(doc)
        body["metadata"].pop("namespace", None)
        return [body]
    assert doc["kind"] == "Deployment", path
    template = doc["spec"]["template"]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **copy.deepcopy(template["metadata"]),
                "name": f"{doc['metadata']['name']}-{i}",
            },
            "spec": copy.deepcopy(template["spec"]),
        }
        for i in range(int(doc["spec"].get("replicas", 1)))
    ]


EXAMPLES = ROOT / "examples" / "migration"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_docs_before_manifests_run_unchanged(
    chart_install: ChartInstall, tmp_path: Path, mechanism: str
) -> None:
    """docs/migration.md's "before" manifests of the four sources, unchanged (only their
    namespace is the test's): KAI's notebook (gpu-fraction 0.5), HAMi's small-models (4 x
    gpumem-percentage 25 + gpucores 25), Volcano's vgpu-trainer (2 vGPUs of 8000 MiB and 50 %
    cores, vgpu-mode hami-core) and the device plugin's inference (2 x nvidia.com/gpu: 1), on
    two nodes of four T4s."""
    files = ("kai-before", "hami-before", "volcano-before", "device-plugin-before")
    manifests = {f: _pods_of(EXAMPLES / f"{f}.yaml") for f in files}
    label = f"docs-{mechanism}"
    with live(chart_install, tmp_path, mechanism, label, f"{NODE}-a", f"{NODE}-b") as state:
        plane = state.plane
        stored = {
            p["metadata"]["name"]: (p, create(plane, pod_path(state.inside), p))
            for pods in manifests.values()
            for p in pods
        }
        given = {}
        for name, (written, created) in stored.items():
            bound, claim, given[name] = state.bound_with(name)
            state.record(name, written, created, bound, claim)
            assert observed(created).scheduler == "biaxial"
        for pods in manifests.values():
            for p in pods:
                name = p["metadata"]["name"]
                state.untouched(name, p, create(plane, pod_path(state.outside), p))
        ((_, kai, whole, _),) = given["notebook"]
        assert _bytes(kai) == whole // 2  # gpu-fraction 0.5
        for i in range(4):  # HAMi: a quarter of a GPU's memory and 25 % of its cores each
            ((_, memory, whole, cores),) = given[f"small-models-{i}"]
            assert (_bytes(memory), cores) == (whole // 4, "25")
        trainer = given["vgpu-trainer"]  # Volcano: 2 GPUs, 8000 MiB and 50 % cores of each
        assert len({g[0] for g in trainer}) == 2
        assert [(m, c) for _, m, _, c in trainer] == [("8000Mi", "50")] * 2
        for i in range(2):  # the device plugin's replicas: a whole GPU each
            ((_, memory, whole, _),) = given[f"inference-{i}"]
            assert _bytes(memory) == whole
