"""End to end over the API emulator with real processes: two ``biaxial kubelet-plugin``
processes (fake T4 and A10G GPUs on ``gpu-t4`` and ``gpu-a10g``) publish their ResourceSlices,
the controller places pattern D, a HAMi-style deployment, pattern A and a pod with a claim
from a template, exactly where ``biaxial simulate`` places them; a fake kubelet then prepares
every claim through the plugin on the pod's node (CDI specs written), and unprepares them when
the pods go, after which nothing is left allocated. A second run kills the controller between
two commit writes, restarts it under injected API faults, and checks the same outcome."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects, objects_of_kind
from biaxial.simulate.simulator import build_inventory, expand_deployment, simulate
from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    check_invariants,
    claim_template,
    device_classes,
    fast_settings,
    leftovers,
    pod_claim_keys,
)
from tests.integration.fake_kubelet import FakeKubelet, PluginProcess

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = [
    ROOT / "examples" / "reference-cluster.yaml",
    ROOT / "examples" / "four-patterns" / "d-spread-spread.yaml",
    ROOT / "examples" / "hami" / "vllm-deployment.yaml",
    ROOT / "examples" / "four-patterns" / "a-binpack-binpack.yaml",
]
PROFILES = {"gpu-t4": "t4x4", "gpu-a10g": "a10gx4"}
JSON = dict[str, Any]


@pytest.fixture
def plugins(
    emulator: Emulator, claim_controller: ResourceClaimController
) -> Iterator[dict[str, PluginProcess]]:
    """The reference cluster's nodes, each with a running kubelet plugin."""
    objects = load_objects([str(p) for p in SCENARIO])
    nodes, _ = build_inventory(objects_of_kind(objects, "Cluster")[0])
    for node in nodes:
        meta = {k: v for k, v in node.raw["metadata"].items() if k != "uid"}
        emulator.create({**node.raw, "metadata": meta})
        emulator.update_status("nodes", node.node.name, node.raw["status"])
    for dc in device_classes():
        emulator.create(dc)
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxe"))
    kubeconfig = emulator.write_kubeconfig(root / "kubeconfig")
    started: dict[str, PluginProcess] = {}
    try:
        library = root / "libvgpu.so"  # fractions use hami-core sharing by default
        library.write_bytes(b"")
        for name, profile in PROFILES.items():
            (root / name).mkdir()
            started[name] = PluginProcess(
                root / name,
                kubeconfig,
                node=name,
                profile=profile,
                name=name,
                extra=["--hami-core-library", str(library)],
            )
            started[name].start()
        emulator.wait_until(
            lambda: (
                {s["spec"]["nodeName"] for s in emulator.list("resourceslices")} == set(PROFILES)
            ),
            timeout=20,
        )
        yield started
    finally:
        codes = {name: p.stop() for name, p in started.items()}
        shutil.rmtree(root, ignore_errors=True)
    assert all(code == 0 for code in codes.values()), codes


def _pods(objects: list[JSON]) -> list[JSON]:
    out = []
    for deployment in objects_of_kind(objects, "Deployment"):
        for template in expand_deployment(deployment):
            meta = {k: v for k, v in template["metadata"].items() if k != "ownerReferences"}
            spec = {"schedulerName": "biaxial", **template["spec"]}
            out.append({**template, "metadata": meta, "spec": spec})
    return out


def _claim_pod() -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "claimer", "namespace": "default"},
        "spec": {
            "schedulerName": "biaxial",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "quarter"}],
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def _bound(emulator: Emulator, name: str) -> bool:
    return bool(((emulator.get("pods", name, "default") or {}).get("spec") or {}).get("nodeName"))


def _prepare_all(emulator: Emulator, plugins: dict[str, PluginProcess]) -> dict[str, list[str]]:
    """Play each node's kubelet: prepare every claim of every pod bound there."""
    prepared: dict[str, list[str]] = {}
    for p in emulator.list("pods"):
        node = p["spec"]["nodeName"]
        refs = []
        for key in pod_claim_keys(p):
            namespace, name = key.split("/")
            claim = emulator.get("resourceclaims", name, namespace)
            assert claim is not None
            refs.append((namespace, claim["metadata"]["uid"], name))
        with FakeKubelet(plugins[node].registration_socket) as kubelet:
            kubelet.notify(registered=True)
            answers = kubelet.dra("v1").prepare(refs)
        for _, uid, name in refs:
            assert answers[uid].error == "", f"{p['metadata']['name']}: {answers[uid].error}"
            spec = plugins[node].cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{uid}.json"
            assert spec.exists(), f"no CDI spec for claim {name}"
            prepared.setdefault(node, []).append(uid)
    return prepared


def _unprepare_and_delete(emulator: Emulator, plugins: dict[str, PluginProcess]) -> None:
    refs_by_node: dict[str, list[tuple[str, str, str]]] = {}
    for p in emulator.list("pods"):
        for key in pod_claim_keys(p):
            namespace, name = key.split("/")
            claim = emulator.get("resourceclaims", name, namespace)
            assert claim is not None
            refs_by_node.setdefault(p["spec"]["nodeName"], []).append(
                (namespace, claim["metadata"]["uid"], name)
            )
        emulator.delete("pods", p["metadata"]["name"], "default")
    for node, refs in refs_by_node.items():
        with FakeKubelet(plugins[node].registration_socket) as kubelet:
            kubelet.notify(registered=True)
            assert set(kubelet.dra("v1").unprepare(refs).values()) == {""}
        assert not list(plugins[node].cdi_dir.glob("k8s.gpu.biaxial.dev-gpu_*.json"))
    emulator.finish_pod_deletions()
    emulator.wait_until(
        lambda: not leftovers(emulator), timeout=30, message=str(leftovers(emulator))
    )


def _expected() -> dict[str, tuple[str, list[str]]]:
    classes = device_classes()
    result = simulate(load_objects([str(p) for p in SCENARIO]), default_classes=classes)
    assert not result.unschedulable
    return {p.pod: (p.node, sorted(d["device"] for d in p.devices)) for p in result.placements}


def _live(emulator: Emulator, names: list[str]) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name in names:
        p = emulator.get("pods", name, "default")
        assert p is not None
        devices = []
        for key in pod_claim_keys(p):
            namespace, claim_name = key.split("/")
            claim = emulator.get("resourceclaims", claim_name, namespace) or {}
            devices += [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        out[f"default/{name}"] = (p["spec"]["nodeName"], sorted(devices))
    return out


def test_placed_as_simulated_and_prepared_by_the_plugins(
    emulator: Emulator, plugins: dict[str, PluginProcess]
) -> None:
    pods = _pods(load_objects([str(p) for p in SCENARIO]))
    names = [p["metadata"]["name"] for p in pods]
    controller = ControllerThread(emulator).start()
    try:
        for p in pods:
            emulator.create(p)
            emulator.wait_until(lambda n=p["metadata"]["name"]: _bound(emulator, n), timeout=20)
        assert _live(emulator, names) == _expected()
        emulator.create(claim_template("quarter", memory="2Gi"))
        emulator.create(_claim_pod())
        emulator.wait_until(lambda: _bound(emulator, "claimer"), timeout=20)
        assert check_invariants(emulator) == []
        prepared = _prepare_all(emulator, plugins)
        assert sum(len(v) for v in prepared.values()) == len(names) + 1
        _unprepare_and_delete(emulator, plugins)
    finally:
        controller.stop()
    assert controller.error is None


def test_killed_controller_under_faults_then_prepared(
    emulator: Emulator, plugins: dict[str, PluginProcess]
) -> None:
    pods = _pods(load_objects([str(p) for p in SCENARIO]))
    names = [p["metadata"]["name"] for p in pods]
    first = ControllerThread(emulator, crash_at=lambda step, _key: step == "bridge-link").start()
    for p in pods:
        emulator.create(p)
    try:
        emulator.wait_until(lambda: first.crashed_at is not None, timeout=20)
    finally:
        first.kill()
    assert check_invariants(emulator) == []
    emulator.fail_next_write(409, resource="resourceclaims", count=2)
    emulator.fail_next(503, verbs="create", resource="pods/binding", count=2)
    emulator.drop_watches(expire=True)
    second = ControllerThread(emulator, fast_settings(identity="second")).start()
    try:
        emulator.wait_until(lambda: all(_bound(emulator, n) for n in names), timeout=30)
        assert check_invariants(emulator) == []
        _prepare_all(emulator, plugins)
        _unprepare_and_delete(emulator, plugins)
    finally:
        second.stop()
    assert second.error is None
