"""The chart's admission step (a MutatingAdmissionPolicy) on the real API server, driven by the
same table as the pure function (tests/admission_cases.py): every case's pod, created unchanged
in an opted-in namespace, ends up as :func:`driver.scheduling.admission.admit` says; in a
namespace outside the scope it is stored as written."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from biaxial.cli import main
from tests.admission_cases import (
    CASES,
    IN_SCOPE,
    OUT_OF_SCOPE,
    SOURCES,
    VALUES,
    Case,
    container,
    expected,
    observed,
    pod,
)
from tests.apiserver.conftest import ChartInstall
from tests.apiserver.seed import on_test_nodes, seeded
from tests.cluster.controlplane import (
    RUNTIME_CONFIG,
    ControlPlane,
    ControlPlaneError,
    object_path,
)
from tests.render_chart import render_objects

JSON = dict[str, Any]
TEST = "admission"
NODE = "admission-t4"


@dataclass(frozen=True)
class Admission:
    plane: ControlPlane
    inside: str
    outside: str

    def create(self, namespace: str, body: JSON, *, dry_run: bool = False) -> JSON:
        """The pod as the server stores it; then deleted again (unless a dry run), so that no
        pending GPU pod is left for the session's other tests' schedulers."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        status, stored = self.plane.request(
            "POST", path + ("?dryRun=All" if dry_run else ""), copy.deepcopy(body)
        )
        assert status == 201, stored
        if not dry_run:
            name = stored["metadata"]["name"]
            status, _ = self.plane.request("DELETE", f"{path}/{name}?gracePeriodSeconds=0")
            assert status == 200
        return dict(stored)


def _namespace(plane: ControlPlane, name: str, labels: dict[str, str]) -> None:
    plane.apply(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}]
    )


def _wait_for_policy(plane: ControlPlane, namespace: str, timeout: float = 30.0) -> None:
    """A new policy is enforced once the server's informer has seen it (a second or two): a
    dry-run GPU pod until it comes back sent to biaxial."""
    probe = pod("admission-probe", container("main", **{"nvidia.com__gpu": "1"}))
    path = f"/api/v1/namespaces/{namespace}/pods?dryRun=All"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = plane.request("POST", path, probe)
        assert status == 201, body
        if body["spec"].get("schedulerName") == "biaxial":
            return
        time.sleep(0.2)
    raise ControlPlaneError("the chart's admission policy is not enforced after 30 s")


@pytest.fixture(scope="module")
def admission(chart_install: ChartInstall) -> Iterator[Admission]:
    plane = chart_install.plane
    values = copy.deepcopy(VALUES)
    if plane.release.minor in RUNTIME_CONFIG:  # 1.34, 1.35: beta, served as asked
        values["admission"]["apiVersion"] = "admissionregistration.k8s.io/v1beta1"
    objects = [
        r.obj for r in render_objects(values) if r.kind.startswith("MutatingAdmissionPolicy")
    ]
    assert [o["kind"] for o in objects] == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ]
    _namespace(plane, "admission-in", IN_SCOPE)
    _namespace(plane, "admission-out", OUT_OF_SCOPE)
    plane.apply(objects)
    _wait_for_policy(plane, "admission-in")
    yield Admission(plane, "admission-in", "admission-out")
    for namespace in ("admission-in", "admission-out"):
        plane.request("DELETE", f"/api/v1/namespaces/{namespace}")
    for obj in reversed(objects):
        plane.request("DELETE", object_path(obj))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_in_an_opted_in_namespace(admission: Admission, case: Case) -> None:
    stored = admission.create(admission.inside, case.pod)
    assert observed(stored) == expected(case, in_scope=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_outside_the_scope_untouched(admission: Admission, case: Case) -> None:
    stored = admission.create(admission.outside, case.pod)
    assert observed(stored) == expected(case, in_scope=False)
    assert "biaxial.dev/admission" not in (stored["metadata"].get("annotations") or {})


@pytest.mark.parametrize("name", SOURCES)
def test_only_the_scheduler_the_gpu_and_the_note_change(admission: Admission, name: str) -> None:
    """The four sources' pods: apart from the fields admission owns, the stored pod is the one
    stored outside the scope."""
    case = next(c for c in CASES if c.name == name)
    body = copy.deepcopy(case.pod)
    body["metadata"]["name"] += "-again"
    inside = admission.create(admission.inside, body, dry_run=True)
    outside = admission.create(admission.outside, body, dry_run=True)
    for stored in (inside, outside):
        stored["metadata"] = {"annotations": stored["metadata"].get("annotations", {})}
        stored["spec"].pop("schedulerName")
        stored.pop("status", None)
        for c in stored["spec"]["containers"]:
            resources = c.get("resources", {})
            for part in ("limits", "requests"):
                resources.get(part, {}).pop("nvidia.com/gpu", None)
                if resources.get(part) == {}:
                    del resources[part]
    inside["metadata"]["annotations"].pop("biaxial.dev/admission")
    assert inside == outside


def test_the_admitted_pods_get_their_devices_and_shares(
    admission: Admission, tmp_path: Path
) -> None:
    """The four sources' unchanged pods, as the real server stores them after admission, with a
    node of four T4s and the chart's DeviceClasses read back from the server: biaxial places
    each with its devices and its share (simulate runs the controller's decision code)."""
    plane = admission.plane
    namespace = "admission-devices"
    with seeded(plane, TEST) as state:
        node = state.gpu_node(NODE, "t4x4")
        state.add(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": IN_SCOPE},
            }
        )
        _wait_for_policy(plane, namespace)
        stored = []
        for name in SOURCES:
            body = copy.deepcopy(next(c for c in CASES if c.name == name).pod)
            body["metadata"]["namespace"] = namespace
            stored.append(state.add(on_test_nodes(body, TEST)))
        _, slices = plane.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE}"
        )
        _, classes = plane.request("GET", "/apis/resource.k8s.io/v1/deviceclasses")
        objects = [
            {"apiVersion": "v1", "kind": "Node", **node},
            *(
                {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s}
                for s in slices["items"]
            ),
            *(
                {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", **c}
                for c in classes["items"]
            ),
            *({"apiVersion": "v1", "kind": "Pod", **p} for p in stored),
        ]
    for obj in objects:
        obj["metadata"].pop("managedFields", None)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["simulate", str(path), "--no-default-classes", "-o", "json"])
    assert code == 0
    result = json.loads(out.getvalue())
    placed = {
        p["pod"].split("/")[1]: [
            (d["device"], (d.get("consumedCapacity") or {}).get("memory", "whole"))
            for d in p["devices"]
        ]
        for p in result["placements"]
    }
    assert placed == {
        "kai-fraction": [("gpu-0", "7680Mi")],  # gpu-fraction 0.5 of a T4's 15360 MiB
        "hami": [("gpu-0", "4000Mi")],  # nvidia.com/gpumem
        "volcano": [("gpu-0", "2000Mi")],  # volcano.sh/vgpu-memory
        "device-plugin": [("gpu-1", "15Gi"), ("gpu-2", "15Gi")],  # two whole GPUs
    }, result["unschedulable"]
