"""The chart's claim-protection policy as the real API server enforces it: a tenant cannot free
a running pod's devices by stripping its claim's finalizer; the controller's own path
(unreserve, deallocate, then remove the finalizer) always goes through."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.apiserver.conftest import ChartInstall
from tests.cluster.controlplane import ControlPlane

JSON = dict[str, Any]
FINALIZER = "gpu.biaxial.dev/allocation"
BUILTIN = "resource.kubernetes.io/delete-protection"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
_names = itertools.count()


def _ok(answer: tuple[int, Any], *expected: int) -> JSON:
    status, body = answer
    assert status in expected, (status, body.get("message") if isinstance(body, dict) else body)
    return dict(body)


EDIT = ["get", "list", "watch", "create", "update", "patch", "delete"]


def _tenant(plane: ControlPlane) -> tuple[str, str]:
    """A new namespace and a ServiceAccount with edit rights on pods and claims there only,
    as an administrator grants a tenant that uses DRA (the built-in `edit` role has no
    ResourceClaims in 1.37, and its rules are aggregated by a controller this control plane
    does not run). Nothing on claims' status: that is the allocator's."""
    namespace = f"tenant-{next(_names)}"
    token = plane.service_account_token(namespace, "tenant")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "edit", "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": EDIT},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": EDIT},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant-edit", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
    }
    plane.apply([role, binding])
    _wait_until_allowed(plane, token, namespace)
    return namespace, token


def _wait_until_allowed(plane: ControlPlane, token: str, namespace: str) -> None:
    """RBAC takes effect once the authorizer's informer has the new role and binding: ask,
    as the tenant, until it is in effect."""
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    asks = [("create", "", "pods"), ("update", "resource.k8s.io", "resourceclaims")]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answers = [
            _ok(plane.request("POST", path, _review(namespace, *ask), token=token), 201)
            for ask in asks
        ]
        if all(a["status"]["allowed"] for a in answers):
            return
        time.sleep(0.05)
    raise AssertionError(f"the tenant's role in {namespace} is not in effect after 30 s")


def _review(namespace: str, verb: str, group: str, resource: str) -> JSON:
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


def _claim(plane: ControlPlane, namespace: str, token: str, name: str) -> JSON:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.biaxial.dev"}}]
            }
        },
    }
    return _ok(plane.request("POST", CLAIMS.format(ns=namespace), body, token=token), 201)


def _pod(plane: ControlPlane, namespace: str, token: str, claim: str) -> JSON:
    """A pod of the tenant that uses ``claim`` (pending: nothing schedules it here)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{claim}-pod"},
        "spec": {
            "schedulerName": "biaxial",
            "serviceAccountName": "tenant",
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "main", "image": "cuda:test", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }
    path = f"/api/v1/namespaces/{namespace}/pods"
    return _ok(plane.request("POST", path, body, token=token), 201)


def _update(
    plane: ControlPlane, path: str, edit: Callable[[JSON], None], *, token: str | None
) -> tuple[int, Any]:
    """Read, edit, write back on the version read (as ``kubectl edit`` does), again on a
    conflict (kube-controller-manager drops the reservations of deleted pods too)."""
    for _ in range(5):
        obj = _ok(plane.request("GET", path.removesuffix("/status"), token=token), 200)
        edit(obj)
        status, body = plane.request("PUT", path, obj, token=token)
        if status != 409:
            return status, body
    raise AssertionError(f"{path}: conflicts on every try")


class Controller:
    """The test playing biaxial's controller (or kube-scheduler: any allocator), under the
    controller's ServiceAccount's real token."""

    def __init__(self, chart: ChartInstall, namespace: str, name: str) -> None:
        self.plane = chart.plane
        self.token = chart.controller_token()
        self.path = f"{CLAIMS.format(ns=namespace)}/{name}"

    def get(self) -> tuple[int, Any]:
        return self.plane.request("GET", self.path, token=self.token)

    def write(self, path: str, edit: Callable[[JSON], None]) -> tuple[int, Any]:
        return _update(self.plane, path, edit, token=self.token)

    def add_finalizer(self, finalizer: str) -> JSON:
        def edit(claim: JSON) -> None:
            claim["metadata"].setdefault("finalizers", []).append(finalizer)

        return _ok(self.write(self.path, edit), 200)

    def allocate_and_reserve(self, pod: JSON, driver: str = "gpu.biaxial.dev") -> JSON:
        result = {"request": "gpu", "driver": driver, "pool": "gpu-node-1", "device": "gpu-0"}
        ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}

        def edit(claim: JSON) -> None:
            claim["status"] = {
                "allocation": {"devices": {"results": [result]}},
                "reservedFor": [ref],
            }

        return _ok(self.write(f"{self.path}/status", edit), 200)

    def unreserve_and_deallocate(self) -> JSON:
        """As the controller's deallocator does once no pod uses the claim."""

        def edit(claim: JSON) -> None:
            claim["status"] = {}

        return _ok(self.write(f"{self.path}/status", edit), 200)

    def remove_finalizer(self) -> tuple[int, Any]:
        """As :meth:`controller.commit.Committer.remove_finalizer`: on the version it read."""

        def edit(claim: JSON) -> None:
            meta = claim["metadata"]
            meta["finalizers"] = [f for f in meta.get("finalizers", []) if f != FINALIZER]

        return self.write(self.path, edit)


def _strip(plane: ControlPlane, path: str, token: str) -> tuple[int, Any]:
    """The tenant removing every finalizer of the claim."""

    def edit(claim: JSON) -> None:
        claim["metadata"].pop("finalizers", None)

    return _update(plane, path, edit, token=token)


def _in_use(
    chart: ChartInstall, name: str, finalizer: str, driver: str = "gpu.biaxial.dev"
) -> tuple[str, str, Controller]:
    """A tenant's claim and its pod, the claim allocated and reserved for the pod by its
    allocator (holding ``finalizer``): the tenant's namespace and token, and the allocator."""
    plane = chart.plane
    namespace, tenant = _tenant(plane)
    _claim(plane, namespace, tenant, name)
    pod = _pod(plane, namespace, tenant, name)
    allocator = Controller(chart, namespace, name)
    allocator.add_finalizer(finalizer)
    allocator.allocate_and_reserve(pod, driver)
    return namespace, tenant, allocator


def test_a_tenant_cannot_strip_the_finalizer_of_a_claim_its_running_pod_uses(
    chart_install: ChartInstall,
) -> None:
    plane = chart_install.plane
    namespace, tenant, controller = _in_use(chart_install, "train", FINALIZER)

    status, body = _strip(plane, controller.path, tenant)
    assert status == 422, body
    message = " ".join(body["message"].split())
    assert f"ResourceClaim {namespace}/train is still allocated" in message
    assert "reserved for pod(s) train-pod" in message
    assert f"its finalizer {FINALIZER} keeps its devices in use" in message
    assert "Delete the pods that use the claim" in message

    # a status write cannot drop finalizers (so the policy leaves the status subresource out)
    def drop_finalizers(claim: JSON) -> None:
        claim["metadata"]["finalizers"] = []

    written = _ok(controller.write(f"{controller.path}/status", drop_finalizers), 200)
    assert written["metadata"]["finalizers"] == [FINALIZER]

    # an unrelated update of the same claim by the tenant goes through
    def relabel(claim: JSON) -> None:
        claim["metadata"]["labels"]["team"] = "b"

    _ok(_update(plane, controller.path, relabel, token=tenant), 200)

    # deleting is accepted, and the finalizer keeps the claim (and its allocation)
    _ok(plane.request("DELETE", controller.path, token=tenant), 200)
    claim = _ok(controller.get(), 200)
    assert claim["metadata"]["deletionTimestamp"]
    assert claim["metadata"]["finalizers"] == [FINALIZER]
    assert claim["status"]["allocation"]
    status, body = _strip(plane, controller.path, tenant)
    assert status == 422, body

    # the pod goes: the controller unreserves, deallocates, removes its finalizer, and the
    # claim is gone
    pod_path = f"/api/v1/namespaces/{namespace}/pods/train-pod"
    _ok(plane.request("DELETE", pod_path, token=tenant), 200)
    controller.unreserve_and_deallocate()
    status, body = controller.remove_finalizer()
    assert status == 200, body
    assert controller.get()[0] == 404


def test_an_unallocated_claims_finalizer_is_the_tenants_to_remove(
    chart_install: ChartInstall,
) -> None:
    plane = chart_install.plane
    namespace, tenant = _tenant(plane)
    _claim(plane, namespace, tenant, "idle")
    controller = Controller(chart_install, namespace, "idle")
    controller.add_finalizer(FINALIZER)
    status, body = _strip(plane, controller.path, tenant)
    assert status == 200, body


@pytest.mark.parametrize(("driver", "refused"), [("gpu.biaxial.dev", True), ("other.dev", False)])
def test_kube_schedulers_finalizer_is_protected_while_it_holds_this_drivers_devices(
    chart_install: ChartInstall, driver: str, refused: bool
) -> None:
    _, tenant, kube_scheduler = _in_use(chart_install, "shared", BUILTIN, driver)
    status, body = _strip(chart_install.plane, kube_scheduler.path, tenant)
    if refused:
        assert status == 422, body
        assert f"its finalizer {BUILTIN} keeps its devices in use" in body["message"]
    else:
        assert status == 200, body


def test_an_allocator_lets_a_claim_marked_for_deletion_go_in_one_write(
    chart_install: ChartInstall,
) -> None:
    """The controller's one-write let-go (``Committer.let_go``): an allocator, one allowed to
    write claims' allocations (``resourceclaims/binding``), may remove its finalizer from a
    claim marked for deletion, allocated and reserved as it is; from a claim not marked, it
    may not (it deallocates first, as before); a tenant may do neither."""
    plane = chart_install.plane
    namespace, tenant, controller = _in_use(chart_install, "batch", FINALIZER)
    let_go = {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}}
    smp = "application/strategic-merge-patch+json"

    status, body = plane.request(
        "PATCH", controller.path, let_go, token=controller.token, content_type=smp
    )
    assert status == 422, body
    assert "is still allocated" in body["message"]

    _ok(plane.request("DELETE", controller.path, token=tenant), 200)
    status, body = plane.request("PATCH", controller.path, let_go, token=tenant, content_type=smp)
    assert status == 422, body

    pod_path = f"/api/v1/namespaces/{namespace}/pods/batch-pod"
    _ok(plane.request("DELETE", pod_path, token=tenant), 200)
    written = _ok(
        plane.request("PATCH", controller.path, let_go, token=controller.token, content_type=smp),
        200,
    )
    assert written["status"]["allocation"], "let go allocated, as it was"
    assert controller.get()[0] == 404
