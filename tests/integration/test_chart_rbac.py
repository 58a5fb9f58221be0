"""The controller's one path the real API server cannot show: run as the chart runs it (its
rendered arguments and environment) against the API emulator, with a 409 Conflict injected on
its first write of a PersistentVolume (so it reads the PV again), record every API request it
makes, and check each against the chart's ClusterRoles and Roles the way the RBAC authorizer
would (the emulator itself authorizes everything).

Everything else is proved on the real control plane, where the real authorizer decides
(``tests/apiserver/test_authorization.py``): both binaries under their ServiceAccounts' real
tokens on their main paths, with no request refused in the audit log, and what the plugin's
role must not allow, asked with SubjectAccessReviews. A fault hook is the emulator's alone.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.authz import workload
from tests.emulator import Emulator, ResourceClaimController, VolumeController
from tests.emulator.faults import RequestRecord
from tests.integration.controller_env import bound_pods, pod, seed_cluster
from tests.integration.fake_kubelet import wait
from tests.render_chart import NAMESPACE, render_objects
from tests.unit.builders import pv, pvc, storage_class

JSON = dict[str, Any]
NODE = "node-a"
DRIVER = "gpu.biaxial.dev"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _ok(url: str) -> bool:
    return _status(url) == 200


# --------------------------------------------------------------------------- the authorizer


def _split(record: RequestRecord) -> tuple[str, str, str | None, str | None] | None:
    """(group, resource[/subresource], namespace, name) of a resource request; None for
    discovery and other non-resource paths (allowed to every user by system:discovery)."""
    parts = [p for p in record.path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    return group, resource, namespace, name


def _verb(record: RequestRecord, name: str | None) -> str:
    watch = record.query.get("watch", "").lower() in {"1", "true"}
    return {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[record.method]


def _allowed(rules: list[JSON], group: str, resource: str, verb: str, name: str | None) -> bool:
    return any(
        group in rule["apiGroups"]
        and resource in rule["resources"]
        and verb in rule["verbs"]
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
        for rule in rules
    )


def denied(objs: list[JSON], service_account: str, records: list[RequestRecord]) -> list[str]:
    """Requests the chart's RBAC would refuse to ``service_account``."""

    def bound(binding_kind: str, role_kind: str) -> list[tuple[JSON, str | None]]:
        out = []
        for b in objs:
            if b["kind"] != binding_kind:
                continue
            if not any(s.get("name") == service_account for s in b["subjects"]):
                continue
            role = next(
                o
                for o in objs
                if o["kind"] == role_kind and o["metadata"]["name"] == b["roleRef"]["name"]
            )
            out.append((role, b["metadata"].get("namespace")))
        return out

    cluster_rules = [
        r for role, _ in bound("ClusterRoleBinding", "ClusterRole") for r in role["rules"]
    ]
    namespaced = bound("RoleBinding", "Role")
    problems = []
    for record in records:
        split = _split(record)
        if split is None:
            continue
        group, resource, namespace, name = split
        verb = _verb(record, name)
        rules = cluster_rules + [
            r for role, ns in namespaced if ns == namespace for r in role["rules"]
        ]
        if not _allowed(rules, group, resource, verb, name):
            where = f" in {namespace}" if namespace else ""
            problems.append(f"{verb} {group or 'core'}/{resource} {name or ''}{where}")
    return sorted(set(problems))


def test_the_authorizer_model_refuses_what_is_not_granted() -> None:
    objs = [r.obj for r in render_objects()]
    record = RequestRecord(
        method="DELETE",
        path="/api/v1/nodes/n",
        query={},
        content_type="",
        verb="delete",
        resource="nodes",
        status=200,
    )
    assert denied(objs, "biaxial-controller", [record]) == ["delete core/nodes n"]
    lease = RequestRecord(
        method="PUT",
        path="/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x",
        query={},
        content_type="",
        verb="update",
        resource="leases",
        status=200,
    )
    # the leader-election Role is granted in the release namespace only
    assert denied(objs, "biaxial-controller", [lease]) != []


def test_the_controller_role_grants_no_templates_and_only_its_own_lease() -> None:
    """Measured before: the controller could read every ResourceClaimTemplate (it never does)
    and get or update any Lease in the release namespace."""
    objs = [r.obj for r in render_objects()]
    sa = "biaxial-controller"
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    templates = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"
    refused = [
        _request("GET", templates),
        _request("GET", f"{templates}/t"),
        _request("GET", f"{leases}/another-lease"),
        _request("PUT", f"{leases}/another-lease"),
    ]
    assert len(denied(objs, sa, refused)) == len(refused)
    own = [
        _request("POST", leases),
        _request("GET", f"{leases}/biaxial-controller"),
        _request("PUT", f"{leases}/biaxial-controller"),
    ]
    assert denied(objs, sa, own) == []


def _request(method: str, path: str, **query: str) -> RequestRecord:
    return RequestRecord(
        method=method, path=path, query=query, content_type="", verb="", resource="", status=200
    )


# --------------------------------------------------------------------------- the runs


@pytest.fixture
def short_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxr"))  # unix socket paths stay short
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _volume_pod(name: str, claim: str) -> JSON:
    out = pod(name)
    out["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
    return out


def _created(obj: JSON) -> JSON:
    out = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
    out.pop("status", None)
    return out


def test_controller_needs_nothing_the_chart_does_not_grant(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
    short_root: Path,
) -> None:
    port = _free_port()
    objs = [
        r.obj
        for r in render_objects(
            {
                "controller": {
                    "metricsPort": port,
                    "healthPort": _free_port(),
                    "leaderElection": {"leaseDuration": 3, "renewDeadline": 2, "retryPeriod": 0.5},
                }
            }
        )
    ]
    args, env, c = workload(objs, "Deployment")
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    seed_cluster(emulator)
    kubeconfig = emulator.write_kubeconfig(short_root / "kubeconfig")
    proc = subprocess.Popen(
        [sys.executable, "-m", "biaxial", *args, "--kubeconfig", str(kubeconfig)],
        env={**os.environ, **env, "BIAXIAL_IDENTITY": "biaxial-controller-0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for url in (base + c[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")):
            wait(functools.partial(_ok, url), 20, url)
        emulator.create(pod("legacy", legacy_gpus=1, gpumem=4000))
        emulator.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": "default"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                        }
                    }
                },
            }
        )
        emulator.create(pod("templated", template="one-gpu"))
        emulator.create(storage_class("wffc"))
        emulator.create(storage_class("local", provisioner="kubernetes.io/no-provisioner"))
        emulator.create(_created(pvc("cache")))
        emulator.create(_created(pvc("dataset", cls="local")))
        emulator.create(_created(pv("local", cls="local", hostname="gpu-t4")))
        emulator.fail_next_write(409, resource="persistentvolumes", verb="patch")
        emulator.create(_volume_pod("provisioned", "cache"))
        emulator.create(_volume_pod("static", "dataset"))
        wanted = {"legacy", "templated", "provisioned", "static"}
        wait(lambda: wanted <= set(bound_pods(emulator)), 20, "pods bound")
        lease = emulator.get("leases", "biaxial-controller", NAMESPACE)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "biaxial-controller-0"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    records = list(emulator.requests)
    assert any(r.path.endswith("/binding") for r in records)
    assert any(
        r.method == "PATCH" and r.path.endswith("persistentvolumeclaims/cache") for r in records
    )
    assert any(r.method == "GET" and r.path.endswith("persistentvolumes/local") for r in records)
    assert denied(objs, "biaxial-controller", records) == []
