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
MIB = 1024 * 1024


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
def t4_node(plane: ControlPlane) -> Iterator[JSON]:
    """A Ready node kwok runs pods on, with four fake T4s published as the plugin would."""
    ensure_kwok(plane)
    node = gpu_node(plane, NODE)
    with open_backend("t4x4", node_name=NODE) as backend:
        gpus = backend.discover()
    slices = [
        create(plane, f"{RESOURCE}/resourceslices", s.to_api())
        for s in build_slices(
            gpus, node_name=NODE, driver_name=DRIVER, node_uid=node["metadata"]["uid"]
        )
    ]
    try:
        yield node
    finally:
        for s in slices:
            delete(
                plane,
                object_path({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s}),
            )
        delete(plane, f"/api/v1/nodes/{NODE}")


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


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_unchanged_manifests_end_bound_by_biaxial_with_their_shares(
    chart_install: ChartInstall, tmp_path: Path, mechanism: str
) -> None:
    plane = chart_install.plane
    label = f"live-{mechanism}"
    inside, outside = f"admission-live-{mechanism}", f"admission-live-out-{mechanism}"
    values = values_for(mechanism, plane, label)
    objects = rendered_admission(values)
    controller = ControllerProcess(chart_install, tmp_path, f"ctl-admission-{mechanism}")
    if mechanism == "webhook":
        pki = make_pki(tmp_path / "pki")
        port = free_port()
        controller.argv += _webhook_args(values, port, pki.serving_cert, pki.serving_key)
        (configuration,) = objects
        objects = [pointed_at(configuration, port, pki)]
    manifests = {
        name: copy.deepcopy(next(c for c in CASES if c.name == name).pod) for name in SOURCES
    }
    report: list[str] = []
    with t4_node(plane):
        controller.start()
        try:
            wait(controller.leading, timeout_s=60, what="leadership")
            plane.apply(objects)
            _namespace(plane, inside, {OPT_IN_LABEL: label})
            _namespace(plane, outside, OUT_OF_SCOPE)
            _wait_for_admission(plane, inside)
            stored = {n: create(plane, pod_path(inside), body) for n, body in manifests.items()}
            bound = {
                n: wait(lambda n=n: _bound(plane, inside, n), timeout_s=120, what=f"{n} bound")
                for n in SOURCES
            }
            untouched = {n: create(plane, pod_path(outside), body) for n, body in manifests.items()}
            given: dict[str, list[tuple[str, str, int]]] = {}
            for name in SOURCES:
                claim, results = _allocation(plane, inside, bound[name])
                node = bound[name]["spec"]["nodeName"]
                given[name] = []
                for r in results:
                    assert r["pool"] == node
                    assert r["driver"] == DRIVER
                    memory = (r.get("consumedCapacity") or {}).get("memory")
                    whole = _device_memory(plane, r["pool"], r["device"])
                    given[name].append((r["device"], memory or "whole", whole))
                assert (sa_user(chart_install, "controller"), "create", "binding") in writers(
                    plane, "pods", name, inside
                )
                report.append(
                    f"--- {name} ({mechanism}): as written\n"
                    f"{yaml.safe_dump(_shown(manifests[name]), sort_keys=False)}"
                    f"--- {name}: as stored in {inside} (after admission)\n"
                    f"{yaml.safe_dump(_shown(stored[name]), sort_keys=False)}"
                    f"--- {name}: bound to {bound[name]['spec']['nodeName']} by biaxial; claim "
                    f"{claim['metadata']['name']} allocation: "
                    f"{[{k: r.get(k) for k in ('device', 'consumedCapacity')} for r in results]}\n"
                    f"--- {name}: as stored in {outside} (out of scope)\n"
                    f"{yaml.safe_dump(_shown(untouched[name]), sort_keys=False)}"
                )
            # the shares: KAI half a T4, HAMi 4000 MiB, Volcano 2000 MiB, two whole GPUs
            (kai,) = given["kai-fraction"]
            assert _bytes(kai[1]) == kai[2] // 2
            assert [m for _, m, _ in given["hami"]] == ["4000Mi"]
            assert [m for _, m, _ in given["volcano"]] == ["2000Mi"]
            pair = given["device-plugin"]
            assert len(pair) == 2
            assert len({d for d, _, _ in pair}) == 2
            assert all(_bytes(m) == w for _, m, w in pair)  # the whole memory: not shared
            for name in SOURCES:
                assert observed(stored[name]).scheduler == "biaxial"
                assert observed(untouched[name]) == observed(manifests[name])
                assert "biaxial.dev/admission" not in (
                    untouched[name]["metadata"].get("annotations") or {}
                )
            # biaxial never binds the out-of-scope pods (they name other schedulers)
            controller_user = sa_user(chart_install, "controller")
            for name in SOURCES:
                assert not [
                    w for w in writers(plane, "pods", name, outside) if w[0] == controller_user
                ]
                assert not (get(plane, pod_path(outside, name)) or {})["spec"].get("nodeName")
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
            print("\n" + "\n".join(report))
    log = controller.log()
    assert code == 0, log[-5000:]
    assert "Traceback" not in log, log[-5000:]
    if mechanism == "webhook":
        assert log.count("admission: ") >= len(SOURCES), log[-5000:]
