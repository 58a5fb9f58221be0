"""``biaxial simulate`` on a real cluster's state, with the API emulator as the cluster:

* a snapshot taken with ``kubectl get nodes,resourceslices,deviceclasses,resourceclaims,pods
  -A -o yaml`` simulates with no ``Cluster`` inventory (running pods and their allocated
  claims are state; the cluster's pending biaxial pods and new manifests are placed);
* ``--kubeconfig`` reads the same state live and writes nothing: the emulator's request log
  holds GET requests only, and its store is unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from tests.emulator import Emulator
from tests.integration.controller_env import DRIVER, pod, seed_cluster

KUBECTL = shutil.which("kubectl")


def _running_pod_with_a_gpu(emulator: Emulator) -> None:
    """A pod bound to gpu-t4, holding gpu-0 there through an allocated claim."""
    claim = emulator.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "runner-gpu", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        }
    )
    runner = pod("runner", claim="runner-gpu")
    created = emulator.create(runner)
    emulator.update_status(
        "resourceclaims",
        "runner-gpu",
        {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "gpu-t4", "device": "gpu-0"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["gpu-t4"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": "runner", "uid": created["metadata"]["uid"]}
            ],
        },
        namespace="default",
    )
    assert claim["metadata"]["name"] == "runner-gpu"
    emulator.bind("runner", "gpu-t4")


def _cluster(emulator: Emulator) -> None:
    seed_cluster(emulator, {"gpu-t4": "t4x4"})
    _running_pod_with_a_gpu(emulator)
    emulator.create(pod("waiting", legacy_gpus=1, gpumem=4000))  # the cluster's own pending pod


def _simulate(*args: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["simulate", *args, "-o", "json"])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}


NEW = """
apiVersion: v1
kind: Pod
metadata:
  name: new
  namespace: default
spec:
  schedulerName: biaxial
  containers:
    - name: c
      image: busybox
      resources:
        limits:
          nvidia.com/gpu: 4
"""


def _check(result: dict[str, Any]) -> None:
    placed = {p["pod"]: p for p in result["placements"]}
    assert set(placed) == {"default/waiting"}
    assert placed["default/waiting"]["devices"][0]["device"] != "gpu-0", "held by the runner"
    (refused,) = result["unschedulable"]
    assert refused["pod"] == "default/new"  # four GPUs: only three are left
    assert result["summary"]["running"] == 1
    gpu0 = next(g for g in result["summary"]["gpus"] if g["device"] == "gpu-0")
    assert gpu0["pods"] == ["default/runner"]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")
def test_a_kubectl_snapshot_simulates_with_no_inventory(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    _cluster(emulator)
    assert KUBECTL is not None
    snapshot = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "nodes,resourceslices,deviceclasses,resourceclaims,pods",
            "-A",
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    dump = tmp_path / "cluster.yaml"
    dump.write_text(snapshot.stdout)
    assert yaml.safe_load(snapshot.stdout)["kind"] == "List"
    new = tmp_path / "new.yaml"
    new.write_text(NEW)
    code, result = _simulate(str(dump), str(new), "--no-default-classes")
    assert code == 0
    _check(result)


def test_an_api_list_snapshot_simulates_with_no_inventory(
    emulator: Emulator, tmp_path: Path
) -> None:
    """The same from the API's own list answers (``ResourceSliceList`` items carry no kind)."""
    _cluster(emulator)
    paths = {
        "nodes": "/api/v1/nodes",
        "slices": "/apis/resource.k8s.io/v1/resourceslices",
        "classes": "/apis/resource.k8s.io/v1/deviceclasses",
        "claims": "/apis/resource.k8s.io/v1/resourceclaims",
        "pods": "/api/v1/pods",
    }
    files = []
    for name, path in paths.items():
        with urllib.request.urlopen(emulator.url + path, timeout=10) as response:
            body = response.read().decode()
        target = tmp_path / f"{name}.json"
        target.write_text(body)
        files.append(str(target))
    new = tmp_path / "new.yaml"
    new.write_text(NEW)
    code, result = _simulate(*files, str(new), "--no-default-classes")
    assert code == 0
    _check(result)


def test_kubeconfig_what_if_reads_and_never_writes(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    _cluster(emulator)
    before = {
        kind: emulator.list(kind)
        for kind in ("nodes", "resourceslices", "deviceclasses", "resourceclaims", "pods")
    }
    emulator.clear_requests()
    new = tmp_path / "new.yaml"
    new.write_text(NEW)
    code, result = _simulate("--kubeconfig", str(kubeconfig), str(new))
    assert code == 0
    _check(result)
    requests = list(emulator.requests)
    assert requests, "the cluster was read"
    assert {r.method for r in requests} == {"GET"}, [(r.method, r.path) for r in requests]
    after = {kind: emulator.list(kind) for kind in before}
    assert after == before, "a what-if writes nothing"
    # Without manifests: the cluster's own pending pods.
    code, result = _simulate("--kubeconfig", str(kubeconfig))
    assert code == 0
    assert [p["pod"] for p in result["placements"]] == ["default/waiting"]


def test_kubeconfig_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["simulate", "--kubeconfig", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("biaxial simulate: error: cannot load Kubernetes config from")
    assert len(err.strip().splitlines()) == 1
    dead = tmp_path / "dead"
    dead.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert main(["simulate", "--kubeconfig", str(dead)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("biaxial simulate: error: listing namespaces:")
    assert len(err.strip().splitlines()) == 1
