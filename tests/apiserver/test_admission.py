"""The chart's admission step on the real API server, by both mechanisms, driven by the same
table as the pure function (tests/admission_cases.py): every case's pod, created unchanged in
an opted-in namespace, ends up as :func:`driver.scheduling.admission.admit` says; in a
namespace outside the scope it is stored as written.

The two mechanisms (``admission.mechanism``): ``policy``, the chart's MutatingAdmissionPolicy
and binding applied as rendered; ``webhook``, the chart's MutatingWebhookConfiguration as
rendered, served by :mod:`controller.webhook` in this test process. For the API server to
call a webhook the test runs, its ``clientConfig`` is a ``url:`` (``https://127.0.0.1:PORT``)
with a CA this test makes, in place of the chart's Service reference (a Service needs a pod
network the test has not); that rendered Service reference is checked by ``make manifests``
and tests/unit/test_chart_admission_webhook.py. Each mechanism acts on namespaces of its own
label value, so one mechanism's leftovers (the API server drops a deleted policy or
configuration a moment later) cannot pass for the other's work.

With the webhook down, pod creation follows the configuration's failurePolicy (Kubernetes
docs, "Dynamic Admission Control", *Failure policy*: "Ignore means that an error calling the
webhook is ignored and the API request is allowed to continue. Fail means that an error
calling the webhook causes the admission to fail and the API request to be rejected").
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from biaxial.cli import main
from controller import webhook
from kubeapi.serving import Board, EndpointServer, reloading_tls_context
from tests.admission_cases import (
    CASES,
    OPT_IN_LABEL,
    OUT_OF_SCOPE,
    SCHEDULERS,
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
    Pki,
    make_pki,
    object_path,
)
from tests.render_chart import render_objects

JSON = dict[str, Any]
TEST = "admission"
NODE = "admission-t4"
MECHANISMS: Final = ("policy", "webhook")
MWC: Final = "MutatingWebhookConfiguration"
#: what the API server is told to call instead of the chart's Service (see the docstring)
WEBHOOK_URL: Final = "https://127.0.0.1:{port}" + webhook.PATH


def values_for(mechanism: str, plane: ControlPlane, label: str) -> JSON:
    """The table's chart values for one mechanism, acting on namespaces labelled
    ``OPT_IN_LABEL: label``."""
    values = copy.deepcopy(VALUES)
    admission = values["admission"]
    admission["mechanism"] = mechanism
    admission["namespaceSelector"] = {"matchLabels": {OPT_IN_LABEL: label}}
    if mechanism == "policy" and plane.release.minor in RUNTIME_CONFIG:
        admission["apiVersion"] = "admissionregistration.k8s.io/v1beta1"  # 1.34, 1.35: beta
    if mechanism == "webhook":
        admission["webhook"] = {"tls": {"source": "secret", "secretName": "test-webhook-tls"}}
    return values


def rendered_admission(values: JSON) -> list[JSON]:
    """The admission objects the chart renders with ``values``: the policy and its binding,
    or the webhook configuration (its Service and certificate are the test's, see above)."""
    kinds = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", MWC}
    return [r.obj for r in render_objects(values) if r.kind in kinds]


def pointed_at(configuration: JSON, port: int, pki: Pki, **changes: Any) -> JSON:
    """The rendered configuration calling ``https://127.0.0.1:port`` with the test CA."""
    out = copy.deepcopy(configuration)
    (hook,) = out["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == webhook.PATH
    hook["clientConfig"] = {
        "url": WEBHOOK_URL.format(port=port),
        "caBundle": base64.b64encode(pki.ca_cert.read_bytes()).decode(),
    }
    hook.update(changes)
    return out


@contextlib.contextmanager
def webhook_server(pki: Pki, schedulers: tuple[str, ...] = SCHEDULERS) -> Iterator[EndpointServer]:
    """:mod:`controller.webhook` served over TLS on 127.0.0.1 as the controller serves it
    (kubeapi.serving, the test CA's serving certificate for 127.0.0.1)."""
    scope = webhook.scope(frozenset(schedulers), "biaxial")
    server = EndpointServer(
        "127.0.0.1",
        0,
        Board(),
        tls=reloading_tls_context(str(pki.serving_cert), str(pki.serving_key), "test"),
        post={webhook.PATH: lambda body: webhook.review(body, scope)},
        name="test-webhook",
    ).start()
    try:
        yield server
    finally:
        server.close()


@dataclass(frozen=True)
class Admission:
    plane: ControlPlane
    mechanism: str
    inside: str
    outside: str
    labels: dict[str, str]

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


def _probe_pod() -> JSON:
    return pod("admission-probe", container("main", **{"nvidia.com__gpu": "1"}))


def _wait_for_admission(plane: ControlPlane, namespace: str, timeout: float = 60.0) -> None:
    """A new policy or configuration is enforced once the server's informer has seen it (a
    second or two): a dry-run GPU pod until it comes back sent to biaxial."""
    path = f"/api/v1/namespaces/{namespace}/pods?dryRun=All"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = plane.request("POST", path, _probe_pod())
        assert status == 201, body
        if body["spec"].get("schedulerName") == "biaxial":
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"the chart's admission step is not enforced after {timeout:g} s")


@contextlib.contextmanager
def installed(plane: ControlPlane, mechanism: str, label: str, root: Path) -> Iterator[None]:
    """The chart's admission step by ``mechanism``, acting on namespaces labelled ``label``
    (the webhook served by this process); removed afterwards."""
    objects = rendered_admission(values_for(mechanism, plane, label))
    with contextlib.ExitStack() as stack:
        if mechanism == "webhook":
            pki = make_pki(root / f"webhook-{label}")
            server = stack.enter_context(webhook_server(pki))
            (configuration,) = objects
            objects = [pointed_at(configuration, server.port, pki)]
        else:
            assert [o["kind"] for o in objects] == [
                "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding",
            ]
        plane.apply(objects)
        try:
            yield
        finally:
            for obj in reversed(objects):
                plane.request("DELETE", object_path(obj))


@pytest.fixture(scope="module", params=MECHANISMS)
def admission(
    chart_install: ChartInstall,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Admission]:
    plane = chart_install.plane
    mechanism = str(request.param)
    labels = {OPT_IN_LABEL: f"table-{mechanism}"}
    inside, outside = f"admission-in-{mechanism}", f"admission-out-{mechanism}"
    with installed(plane, mechanism, labels[OPT_IN_LABEL], tmp_path_factory.mktemp("adm")):
        _namespace(plane, inside, labels)
        _namespace(plane, outside, OUT_OF_SCOPE)
        _wait_for_admission(plane, inside)
        yield Admission(plane, mechanism, inside, outside, labels)
        for namespace in (inside, outside):
            plane.request("DELETE", f"/api/v1/namespaces/{namespace}")


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
    namespace = f"admission-devices-{admission.mechanism}"
    with seeded(plane, TEST) as state:
        node = state.gpu_node(NODE, "t4x4")
        state.add(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": admission.labels},
            }
        )
        _wait_for_admission(plane, namespace)
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


def _stored_or_refused(plane: ControlPlane, namespace: str, body: JSON) -> tuple[int, JSON]:
    """Create ``body`` for real: (status, the stored pod or the API server's Status); a
    created pod is deleted again at once."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    status, answer = plane.request("POST", path, copy.deepcopy(body))
    if status == 201:
        plane.request("DELETE", f"{path}/{answer['metadata']['name']}?gracePeriodSeconds=0")
    return status, dict(answer)


def test_with_the_webhook_down_pod_creation_follows_the_failure_policy(
    chart_install: ChartInstall, tmp_path: Path
) -> None:
    """The chart's configuration (failurePolicy Ignore, as rendered by default), its webhook
    first serving, then stopped: a GPU pod is created unchanged and goes to the scheduler it
    names. The same configuration with failurePolicy Fail: the pod is refused with the API
    server's message, while a pod the matchConditions never send (no GPU) is still created."""
    plane = chart_install.plane
    namespace, label = "admission-down", "down"
    gpu_pod = copy.deepcopy(next(c for c in CASES if c.name == "hami").pod)
    cpu_pod = copy.deepcopy(next(c for c in CASES if c.name == "cpu-only").pod)
    (configuration,) = rendered_admission(values_for("webhook", plane, label))
    assert configuration["webhooks"][0]["failurePolicy"] == "Ignore"  # the chart's default
    configuration["metadata"]["name"] = "biaxial-admission-down"
    pki = make_pki(tmp_path / "pki")
    _namespace(plane, namespace, {OPT_IN_LABEL: label})
    try:
        with webhook_server(pki) as server:
            port = server.port
            ignore = pointed_at(configuration, port, pki)
            plane.apply([ignore])
            _wait_for_admission(plane, namespace)
            status, up = _stored_or_refused(plane, namespace, gpu_pod)
            assert status == 201, up
            assert up["spec"]["schedulerName"] == "biaxial"
        # the webhook is stopped: its port refuses connections
        status, down = _stored_or_refused(plane, namespace, gpu_pod)
        assert status == 201, down
        assert observed(down) == observed(gpu_pod)  # unchanged: default-scheduler, no note
        assert down["spec"]["schedulerName"] == "default-scheduler"
        print(
            f"\nfailurePolicy Ignore, webhook down: created, schedulerName "
            f"{down['spec']['schedulerName']}, annotations "
            f"{down['metadata'].get('annotations', {})}"
        )

        fail = pointed_at(configuration, port, pki, failurePolicy="Fail")
        plane.apply([fail])
        deadline = time.monotonic() + 60
        while True:  # until the API server's informer has the new policy
            status, refused = plane.request(
                "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", copy.deepcopy(gpu_pod)
            )
            if status != 201 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        status, refused = _stored_or_refused(plane, namespace, gpu_pod)
        message = refused.get("message", "")
        print(f"failurePolicy Fail, webhook down: HTTP {status}: {message}")
        # The API server's wording (k8s.io/apiserver pkg/admission/plugin/webhook/errors):
        # an unreachable webhook is an internal error "failed calling webhook <name>".
        assert status == 500, refused
        assert refused["reason"] == "InternalError"
        assert 'failed calling webhook "pods.admission.biaxial.dev"' in message
        assert WEBHOOK_URL.format(port=port) in message
        assert "connection refused" in message
        status, cpu = _stored_or_refused(plane, namespace, cpu_pod)
        assert status == 201, cpu  # matchConditions: never sent, never refused
    finally:
        plane.request("DELETE", object_path(configuration))
        plane.request("DELETE", f"/api/v1/namespaces/{namespace}")
