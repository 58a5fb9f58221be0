"""Real authorization: the chart's roles, policy and delegated /metrics as the real API server
enforces them, and the two components run under nothing but their ServiceAccounts' tokens.

* The ResourceSlice policy stops the plugin from updating or deleting another node's slice, or
  moving its own to another node (creating one is ``test_chart_install``'s).
* The real authorizer refuses the plugin what the chart's role does not grant (claim status,
  listing claims, getting or patching slices), asked with SubjectAccessReviews.
* The kubelet plugin and the controller run as the chart runs them (its rendered arguments and
  environment) with kubeconfigs holding their real tokens; each does its job (the pool
  published, legacy resources advertised, a claim prepared; the Lease taken, a bridge pod, a
  template pod, a provisioned and a static-PV pod bound, the Lease released) and the audit log
  shows no request of theirs refused.
* A tenant (a ServiceAccount with ``edit`` in its own namespace) reads no other namespace's
  claims through anything biaxial serves: the controller's /metrics behind delegated
  authentication refuses it, and the endpoints open to anyone (the probes of both, the
  plugin's /metrics on its loopback address) name no claim. The plugin's gRPC is served on
  unix sockets in the kubelet's directories only (no TCP port), which no tenant pod mounts.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.apiserver.authz import (
    AuditLog,
    Request,
    access_review,
    by_user,
    chart_rbac,
    listening_tcp_ports,
    refused,
    replace_arg,
    service_account_user,
    workload,
)
from tests.apiserver.conftest import ChartInstall, ensure_node
from tests.apiserver.seed import Seeded, create, get, on_test_nodes, seeded
from tests.apiserver.test_chart_install import _slice as node_slice
from tests.cluster.controlplane import ControlPlane
from tests.integration.controller_env import DRIVER, claim_template, pod
from tests.integration.fake_kubelet import FakeKubelet, free_port, scratch_dir, wait
from tests.unit.builders import pv, pvc, storage_class

JSON = dict[str, Any]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m biaxial <args>``, killed on the way out if still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "biaxial", *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def terminate(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, and the clean exit the chart's pods get."""
    proc.terminate()
    code = proc.wait(timeout=30)
    assert code == 0, log.read_text(errors="replace")


def http(
    url: str, token: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10, context=context
        ) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except OSError:
        return 0, ""


def plugin_values(root: Path, **extra: Any) -> JSON:
    dirs = {k: root / k for k in ("reg", "plugins", "cdi", "state", "mps", "lock")}
    for d in dirs.values():
        d.mkdir()
    return {
        "kubeletPlugin": {
            "fakeGpus": "t4x4",
            "advertiseLegacyResources": True,
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "hostPaths": {
                "registry": str(dirs["reg"]),
                "plugins": str(dirs["plugins"]),
                "cdi": str(dirs["cdi"]),
                "state": str(dirs["state"]),
                "mpsRoot": str(dirs["mps"]),
                "hamiLockDir": str(dirs["lock"]),
            },
            **extra,
        }
    }


def allocated_claim(
    plane: ControlPlane, namespace: str, name: str, node: str
) -> tuple[str, str, str]:
    """Claim ``namespace/name`` allocated gpu-0 of ``node``, as a scheduler would write it;
    what the kubelet sends for it."""
    created = create(
        plane,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
    )
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}]
            }
        }
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status"
    status, body = plane.request("PUT", path, created)
    assert status == 200, body
    return (namespace, created["metadata"]["uid"], name)


def did(requests: list[Request], verb: str, resource: str, code: int = 0) -> bool:
    return any(
        r.verb == verb
        and (f"{r.resource}/{r.subresource}" if r.subresource else r.resource) == resource
        and code in (0, r.code)
        for r in requests
    )


# --------------------------------------------------------------------------- the policy


def test_a_plugin_updates_and_deletes_only_its_own_nodes_slices(
    chart_install: ChartInstall,
) -> None:
    plane = chart_install.plane
    ensure_node(plane, "authz-other")
    token = chart_install.plugin_token("authz-own")
    theirs = create(plane, node_slice("authz-other"))
    mine = create(plane, node_slice("authz-own"))
    try:
        path = f"{SLICES}/{theirs['metadata']['name']}"
        theirs["spec"]["devices"].append({"name": "gpu-1"})
        status, body = plane.request("PUT", path, theirs, token=token)
        assert status == 422, body
        assert "may only write ResourceSlices with spec.nodeName 'authz-own'" in body["message"]
        status, body = plane.request("DELETE", path, token=token)
        assert status == 422, body
        # its own slice moved to the other node (and pool): refused as well
        moved = {**mine, "spec": {**mine["spec"], "nodeName": "authz-other"}}
        own_path = f"{SLICES}/{mine['metadata']['name']}"
        status, body = plane.request("PUT", own_path, moved, token=token)
        assert status == 422, body
        # what its role and the policy allow: its own slice
        mine["spec"]["devices"].append({"name": "gpu-1"})
        status, body = plane.request("PUT", own_path, mine, token=token)
        assert status == 200, body
        status, body = plane.request("DELETE", own_path, token=token)
        assert status == 200, body
        assert get(plane, theirs) is not None
    finally:
        for obj in (theirs, mine):
            plane.request("DELETE", f"{SLICES}/{obj['metadata']['name']}")


# --------------------------------------------------------------------------- the roles


def test_the_plugin_reads_claims_by_name_and_nothing_more(chart_install: ChartInstall) -> None:
    """Asked of the real authorizer: the plugin may get a claim, and may not list or watch
    claims, write a claim or its status (nor the 1.36 binding and driver subresources), or
    get or patch a slice (it never does either)."""
    plane = chart_install.plane
    user = service_account_user(chart_install.namespace, chart_install.plugin_account)
    claims = {"group": "resource.k8s.io", "resource": "resourceclaims"}
    slices = {"group": "resource.k8s.io", "resource": "resourceslices"}
    assert access_review(plane, user, verb="get", namespace="team-a", name="c", **claims)
    refused_ = [
        {"verb": "update", "subresource": "status", "namespace": "team-a", **claims},
        {"verb": "patch", "subresource": "status", "namespace": "team-a", **claims},
        {"verb": "patch", "subresource": "binding", "namespace": "team-a", **claims},
        {"verb": "associated-node:update", "subresource": "driver", "name": DRIVER, **claims},
        {"verb": "arbitrary-node:update", "subresource": "driver", "name": DRIVER, **claims},
        {"verb": "list", "namespace": "team-a", **claims},
        {"verb": "list", **claims},
        {"verb": "watch", **claims},
        {"verb": "update", "namespace": "team-a", "name": "c", **claims},
        {"verb": "patch", "namespace": "team-a", "name": "c", **claims},
        {"verb": "delete", "namespace": "team-a", "name": "c", **claims},
        {"verb": "create", "namespace": "team-a", **claims},
        {"verb": "get", "name": "s", **slices},
        {"verb": "patch", "name": "s", **slices},
    ]
    allowed = [spec for spec in refused_ if access_review(plane, user, **spec)]
    assert allowed == []


# --------------------------------------------------------------------------- the plugin


def test_kubelet_plugin_needs_nothing_the_chart_does_not_grant(
    chart_install: ChartInstall,
) -> None:
    plane = chart_install.plane
    node = "authz-plugin"
    user = service_account_user(chart_install.namespace, chart_install.plugin_account)
    with (
        contextlib.ExitStack() as stack,
        scratch_dir("bxa") as root,
        seeded(plane, "authz-plugin") as state,
    ):
        values = plugin_values(root)
        objs = stack.enter_context(chart_rbac(plane, values))
        args, env, container = workload(objs, "DaemonSet")
        kubeconfig = plane.kubeconfig(root / "kubeconfig", token=chart_install.plugin_token(node))
        state.namespace("authz-plugin")
        audit = AuditLog(plane)
        log = root / "plugin.log"
        env = {**env, "NODE_NAME": node, "POD_UID": str(uuid.uuid4())}
        with running([*args, "--kubeconfig", str(kubeconfig)], env, log) as proc:
            port = values["kubeletPlugin"]["metricsPort"]
            health = f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}"
            wait(lambda: http(health)[0] == 200, 30, f"plugin readiness\n{log.read_text()}")

            def published() -> list[JSON]:
                _, listed = plane.request("GET", f"{SLICES}?fieldSelector=spec.nodeName={node}")
                return list(listed["items"])

            wait(published, 20, "the pool published")
            wait(
                lambda: (
                    "nvidia.com/gpumem"
                    in (plane.request("GET", f"/api/v1/nodes/{node}")[1].get("status") or {}).get(
                        "capacity", {}
                    )
                ),
                20,
                "legacy resources on the Node",
            )
            ref = allocated_claim(plane, "authz-plugin", "c1", node)
            (registration,) = (root / "reg").glob("*.sock")
            with FakeKubelet(registration) as kubelet:
                kubelet.notify(registered=True)
                dra = kubelet.dra("v1")
                assert dra.prepare([ref])[ref[1]].error == ""
                assert dra.unprepare([ref]) == {ref[1]: ""}
            terminate(proc, log)
        requests = by_user(audit.settle(), user)
    assert refused(requests, user) == []
    assert did(requests, "create", "resourceslices", 201)
    assert did(requests, "patch", "nodes/status", 200)
    assert did(requests, "get", "resourceclaims", 200)


# --------------------------------------------------------------------------- the controller


def _volume_pod(name: str, claim: str, namespace: str) -> JSON:
    out = pod(name, namespace=namespace)
    out["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
    return out


def _stored(obj: JSON, namespace: str | None = None) -> JSON:
    """A builder's object as a client would create it: no UID, no status."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "uid"}
    if namespace is not None:
        meta["namespace"] = namespace
    out = {**obj, "metadata": meta}
    out.pop("status", None)
    return out


def _provision(plane: ControlPlane, state: Seeded, namespace: str, claim: str) -> bool:
    """Play the external provisioner: once the controller has picked a node for the
    WaitForFirstConsumer claim, create a PV there for it (the real PV controller binds them)."""
    status, body = plane.request(
        "GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
    )
    node = ((body.get("metadata") or {}).get("annotations") or {}).get(
        "volume.kubernetes.io/selected-node"
    )
    if status != 200 or not node:
        return False
    volume = _stored(pv(f"{namespace}-{claim}", cls="authz-wffc", hostname=node))
    volume["spec"]["claimRef"] = {
        "namespace": namespace,
        "name": claim,
        "uid": body["metadata"]["uid"],
    }
    state.add(volume)
    return True


def _bound(plane: ControlPlane, namespace: str) -> dict[str, str]:
    _, listed = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in listed["items"]
        if p["spec"].get("nodeName")
    }


def test_controller_needs_nothing_the_chart_does_not_grant(chart_install: ChartInstall) -> None:
    plane = chart_install.plane
    ns, test = "authz-controller", "authz-controller"
    user = service_account_user(chart_install.namespace, chart_install.controller_account)
    values = {
        "controller": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "leaderElection": {"leaseDuration": 3, "renewDeadline": 2, "retryPeriod": 0.5},
        }
    }
    with (
        chart_rbac(plane, values) as objs,
        scratch_dir("bxc") as root,
        seeded(plane, test) as state,
    ):
        args, env, container = workload(objs, "Deployment")
        state.gpu_node("authz-t4", "t4x4")
        state.namespace(ns)
        state.add(storage_class("authz-wffc"))
        state.add(storage_class("authz-local", provisioner="kubernetes.io/no-provisioner"))
        state.add(_stored(pv("authz-local", cls="authz-local", hostname="authz-t4")))
        kubeconfig = plane.kubeconfig(root / "kubeconfig", token=chart_install.controller_token())
        audit = AuditLog(plane)
        log = root / "controller.log"
        env = {**env, "BIAXIAL_IDENTITY": "biaxial-controller-0"}
        with running([*args, "--kubeconfig", str(kubeconfig)], env, log) as proc:
            port = values["controller"]["metricsPort"]
            ready = f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}"
            wait(lambda: http(ready)[0] == 200, 30, f"controller readiness\n{log.read_text()}")
            state.add(on_test_nodes(pod("legacy", legacy_gpus=1, gpumem=4000, namespace=ns), test))
            state.add(claim_template("one-gpu", namespace=ns))
            state.add(on_test_nodes(pod("templated", template="one-gpu", namespace=ns), test))
            state.add(_stored(pvc("cache", cls="authz-wffc"), ns))
            state.add(_stored(pvc("dataset", cls="authz-local"), ns))
            state.add(on_test_nodes(_volume_pod("provisioned", "cache", ns), test))
            state.add(on_test_nodes(_volume_pod("static", "dataset", ns), test))
            wait(lambda: _provision(plane, state, ns, "cache"), 30, "the claim's node picked")
            wanted = {"legacy", "templated", "provisioned", "static"}
            wait(lambda: wanted <= set(_bound(plane, ns)), 60, f"pods bound\n{log.read_text()}")
            _, lease = plane.request(
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{chart_install.namespace}"
                "/leases/biaxial-controller",
            )
            assert lease["spec"]["holderIdentity"] == "biaxial-controller-0"
            terminate(proc, log)
        requests = by_user(audit.settle(), user)
    assert refused(requests, user) == []
    for verb, resource in [
        ("create", "pods/binding"),
        ("create", "resourceclaims"),  # the bridge claim
        ("patch", "persistentvolumeclaims"),  # the selected node
        ("patch", "persistentvolumes"),  # the static PV's claimRef
        ("update", "leases"),
    ]:
        assert did(requests, verb, resource), (verb, resource)


# --------------------------------------------------------------------------- a tenant


def _role_binding(namespace: str, account: str, cluster_role: str, *, cluster: bool) -> JSON:
    meta: JSON = {"name": f"{account}-{cluster_role}"}
    if not cluster:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding" if cluster else "RoleBinding",
        "metadata": meta,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def test_a_tenant_reads_no_claims_through_anything_biaxial_serves(
    chart_install: ChartInstall,
) -> None:
    plane = chart_install.plane
    node, secret = "authz-tenant", "secret-claim"
    controller_user = service_account_user(
        chart_install.namespace, chart_install.controller_account
    )
    values: JSON = {
        "controller": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "metricsAuth": {"enabled": True, "tlsSecretName": "biaxial-controller-serving"},
            "leaderElection": {"leaseDuration": 3, "renewDeadline": 2, "retryPeriod": 0.5},
        },
    }
    with (
        contextlib.ExitStack() as stack,
        scratch_dir("bxt") as root,
        seeded(plane, "authz-tenant") as state,
    ):
        values["kubeletPlugin"] = plugin_values(root)["kubeletPlugin"]
        objs = stack.enter_context(chart_rbac(plane, values))
        for ns in ("tenant-a", "tenant-b", "monitoring"):
            state.namespace(ns)
        tenant = plane.service_account_token("tenant-a", "tenant")
        # edit's rules (its own and view's): ``edit`` itself is filled in by
        # kube-controller-manager's clusterrole-aggregation controller, which the test
        # control plane does not run (without it, edit and view have no rules)
        for role in ("system:aggregate-to-edit", "system:aggregate-to-view"):
            state.add(_role_binding("tenant-a", "tenant", role, cluster=False))
        scraper = plane.service_account_token("monitoring", "prometheus")
        state.add(_role_binding("monitoring", "prometheus", "biaxial-metrics-reader", cluster=True))
        # the real authorizer as the baseline: the tenant's own claims (once its informer
        # has seen the new binding), not another namespace's
        claims = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims"
        wait(
            lambda: plane.request("GET", claims.format("tenant-a"), token=tenant)[0] == 200,
            10,
            "the tenant's edit rights",
        )
        assert plane.request("GET", claims.format("tenant-b"), token=tenant)[0] == 403

        plugin_args, plugin_env, _ = workload(objs, "DaemonSet")
        args, env, _ = workload(objs, "Deployment")
        args = replace_arg(args, "--metrics-bind-address", "127.0.0.1")
        args = replace_arg(args, "--tls-cert-file", str(plane.pki.serving_cert))
        args = replace_arg(args, "--tls-private-key-file", str(plane.pki.serving_key))
        plugin_kc = plane.kubeconfig(root / "plugin.kc", token=chart_install.plugin_token(node))
        controller_kc = plane.kubeconfig(
            root / "controller.kc", token=chart_install.controller_token()
        )
        audit = AuditLog(plane)
        plugin_log, controller_log = root / "plugin.log", root / "controller.log"
        plugin_env = {**plugin_env, "NODE_NAME": node, "POD_UID": str(uuid.uuid4())}
        env = {**env, "BIAXIAL_IDENTITY": "biaxial-controller-tenant"}
        plugin = stack.enter_context(
            running([*plugin_args, "--kubeconfig", str(plugin_kc)], plugin_env, plugin_log)
        )
        controller = stack.enter_context(
            running([*args, "--kubeconfig", str(controller_kc)], env, controller_log)
        )
        p, c = values["kubeletPlugin"], values["controller"]
        plugin_metrics = f"http://127.0.0.1:{p['metricsPort']}"
        controller_metrics = f"https://127.0.0.1:{c['metricsPort']}/metrics"
        wait(lambda: http(f"{plugin_metrics}/readyz")[0] == 200, 30, "plugin ready")
        wait(
            lambda: http(f"http://127.0.0.1:{c['healthPort']}/readyz")[0] == 200,
            30,
            "controller ready",
        )
        # another namespace's claim, prepared on the plugin's node
        ref = allocated_claim(plane, "tenant-b", secret, node)
        (registration,) = (root / "reg").glob("*.sock")
        with FakeKubelet(registration) as kubelet:
            kubelet.notify(registered=True)
            assert kubelet.dra("v1").prepare([ref])[ref[1]].error == ""

            tls = plane.ssl_context()
            assert http(controller_metrics, tenant, tls)[0] == 403
            assert http(controller_metrics, None, tls)[0] == 401
            assert http(controller_metrics, "not-a-token", tls)[0] == 401
            status, body = http(controller_metrics, scraper, tls)
            assert status == 200, body
            assert "biaxial_" in body
            served = [body]
            for port in (p["healthPort"], c["healthPort"]):
                for path in ("/healthz", "/readyz", "/livez", "/metrics"):
                    status, body = http(f"http://127.0.0.1:{port}{path}", tenant)
                    assert status in (200, 404), (port, path, status)
                    assert path != "/metrics" or status == 404, "metrics on the health port"
                    served.append(body)
            status, body = http(f"{plugin_metrics}/metrics", tenant)
            assert status == 200
            served.append(body)
            leaks = [b for b in served if secret in b or ref[1] in b or "tenant-b" in b]
            assert leaks == []
            # nothing else listens: the plugin's gRPC is on unix sockets in the kubelet's dirs
            assert listening_tcp_ports(plugin.pid) == {p["metricsPort"], p["healthPort"]}
            assert listening_tcp_ports(controller.pid) == {c["metricsPort"], c["healthPort"]}
            assert kubelet.dra("v1").unprepare([ref]) == {ref[1]: ""}
        terminate(controller, controller_log)
        terminate(plugin, plugin_log)
        requests = audit.settle()
    # the controller's reviews of the scrapers were its own, and allowed (auth-delegator)
    reviews = [r for r in by_user(requests, controller_user) if "reviews" in r.resource]
    assert {r.resource for r in reviews} == {"tokenreviews", "subjectaccessreviews"}
    assert refused(requests, controller_user) == []
