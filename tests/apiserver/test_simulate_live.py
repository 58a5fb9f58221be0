"""``biaxial simulate`` on the real API server's state.

A GPU node with slices from the project's slice builder, the chart's DeviceClasses, a running
pod bound to the node holding gpu-0 through an allocated claim, and a pending pod of biaxial's
are written to the real server. Then:

* ``--kubeconfig`` reads them live, under a ServiceAccount bound to ``cluster-admin`` (any
  write would succeed), and the audit log shows that user made list requests only, one per
  kind the simulator reads: no create, update, patch or delete;
* a dump made the way ``kubectl get <kinds> -A -o yaml`` makes it (the kinds of the recipe in
  docs/simulator.md resolved through the server's discovery as kubectl resolves them, each
  list's items given their apiVersion and kind, managed fields left out, all in one ``v1``
  ``List``) gives the same placements.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import yaml

from biaxial.cli import main
from biaxial.simulate.live import READ
from tests.apiserver.authz import AuditLog, by_user, service_account_user
from tests.apiserver.conftest import ChartInstall
from tests.apiserver.seed import Seeded, create, on_test_nodes, seeded
from tests.cluster.controlplane import ControlPlane
from tests.integration.controller_env import DRIVER, ROOT, pod

JSON = dict[str, Any]
TEST = "simulate-live"
NS = "simulate-live"
NODE = "sim-t4"

NEW = f"""
apiVersion: v1
kind: Pod
metadata:
  name: new
  namespace: {NS}
spec:
  schedulerName: biaxial
  nodeSelector:
    biaxial.dev/test: {TEST}
  containers:
    - name: c
      image: busybox
      resources:
        limits:
          nvidia.com/gpu: 4
"""


def _running_pod_with_a_gpu(plane: ControlPlane, state: Seeded) -> None:
    """Pod ``runner`` bound to the node and Running, holding gpu-0 through its claim."""
    claim = state.add(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "runner-gpu", "namespace": NS},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        }
    )
    runner = pod("runner", claim="runner-gpu", namespace=NS)
    runner["spec"]["nodeName"] = NODE
    created = state.add(runner)
    created["status"] = {"phase": "Running"}
    status, body = plane.request("PUT", f"/api/v1/namespaces/{NS}/pods/runner/status", created)
    assert status == 200, body
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "runner", "uid": created["metadata"]["uid"]}],
    }
    status, body = plane.request(
        "PUT", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/runner-gpu/status", claim
    )
    assert status == 200, body


def _cluster(plane: ControlPlane, state: Seeded) -> None:
    state.gpu_node(NODE, "t4x4")
    state.namespace(NS)
    _running_pod_with_a_gpu(plane, state)
    # the cluster's own pending pod
    create(plane, on_test_nodes(pod("waiting", legacy_gpus=1, namespace=NS), TEST))


def _simulate(*args: str) -> tuple[int, JSON]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["simulate", *args, "-o", "json"])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}


def _ours(result: JSON) -> tuple[list[JSON], list[JSON]]:
    """This test's placements and unschedulable pods (the session's cluster has others')."""
    mine = f"{NS}/"
    return (
        [p for p in result["placements"] if p["pod"].startswith(mine)],
        [u for u in result["unschedulable"] if u["pod"].startswith(mine)],
    )


def _check(result: JSON) -> None:
    placed, unschedulable = _ours(result)
    assert [p["pod"] for p in placed] == [f"{NS}/waiting"]
    assert placed[0]["node"] == NODE
    assert placed[0]["devices"][0]["device"] != "gpu-0", "held by the runner"
    assert [u["pod"] for u in unschedulable] == [f"{NS}/new"]  # four GPUs: three are left
    gpu0 = next(
        g for g in result["summary"]["gpus"] if g["device"] == "gpu-0" and g["node"] == NODE
    )
    assert gpu0["pods"] == [f"{NS}/runner"]


# --------------------------------------------------------------------------- kubectl's dump


def _recipe() -> list[str]:
    """The resource names of the dump recipe in docs/simulator.md."""
    text = (ROOT / "docs" / "simulator.md").read_text()
    (names,) = re.findall(r"^kubectl get (\S+) -A -o yaml > cluster\.yaml$", text, re.MULTILINE)
    return str(names).split(",")


def _discovery(plane: ControlPlane) -> dict[str, tuple[str, JSON]]:
    """Every resource name, singular and short name -> (group version, APIResource), for
    each group's preferred version, as kubectl's RESTMapper sees them."""
    versions = ["v1"]
    _, groups = plane.request("GET", "/apis")
    versions += [g["preferredVersion"]["groupVersion"] for g in groups["groups"]]
    out: dict[str, tuple[str, JSON]] = {}
    for gv in versions:
        _, listed = plane.request("GET", f"/api/{gv}" if gv == "v1" else f"/apis/{gv}")
        for res in listed["resources"]:
            if "/" in res["name"]:
                continue
            for name in [res["name"], res.get("singularName"), *res.get("shortNames", [])]:
                if name:
                    out.setdefault(name, (gv, res))
    return out


def kubectl_dump(plane: ControlPlane) -> JSON:
    """What ``kubectl get <recipe> -A -o yaml`` prints: one ``List`` of every object of those
    kinds, in the order named, each with apiVersion and kind, without managed fields."""
    found = _discovery(plane)
    items: list[JSON] = []
    for name in _recipe():
        gv, res = found[name]
        base = f"/api/{gv}" if gv == "v1" else f"/apis/{gv}"
        status, listed = plane.request("GET", f"{base}/{res['name']}")
        assert status == 200, listed
        for item in listed["items"]:
            item["metadata"].pop("managedFields", None)
            items.append({"apiVersion": gv, "kind": res["kind"], **item})
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


# --------------------------------------------------------------------------- the tests


def test_simulate_reads_the_real_server_live_and_writes_nothing(
    chart_install: ChartInstall, tmp_path: Path
) -> None:
    plane = chart_install.plane
    with seeded(plane, TEST) as state:
        _cluster(plane, state)
        # a reader that could write anything: only the audit log shows it does not
        reader = plane.service_account_token(NS, "what-if")
        state.add(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "simulate-live-what-if"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "what-if", "namespace": NS}],
            }
        )
        kubeconfig = plane.kubeconfig(tmp_path / "kubeconfig", token=reader)
        new = tmp_path / "new.yaml"
        new.write_text(NEW)
        audit = AuditLog(plane)
        code, live = _simulate("--kubeconfig", str(kubeconfig), str(new))
        assert code == 0, live
        requests = by_user(audit.settle(), service_account_user(NS, "what-if"))
        _check(live)

        dump = tmp_path / "cluster.yaml"
        dump.write_text(yaml.safe_dump(kubectl_dump(plane)))
        code, offline = _simulate(str(dump), str(new))
        assert code == 0, offline

    assert requests, "the cluster was read"
    assert {r.user_agent.split("/")[0] for r in requests} == {"biaxial-simulate"}
    assert [str(r) for r in requests if r.writes or r.verb != "list"] == []
    assert sorted(r.uri.split("?")[0] for r in requests) == sorted(res.path() for res in READ)
    assert {r.code for r in requests} == {200}
    _check(offline)
    # the same answers for this test's pods; the session's other tests' objects may come and
    # go between the two reads (a namespace being deleted), so only ours are compared
    assert _ours(offline) == _ours(live)
