"""kubectl against the emulator: apply (create, then a 3-way patch), get, delete, and a
strict-validation error, for a cluster-scoped and a namespaced kind."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.emulator import Emulator

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")

MANIFEST = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: node-a-gpus
spec:
  driver: gpu.example.com
  nodeName: node-a
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes: {model: {string: MODEL}}
    capacity: {memory: {value: 16Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  containers: [{name: c, image: registry.k8s.io/pause:3.10}]
"""


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_kubectl_apply_get_delete(emulator: Emulator, kubeconfig: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(MANIFEST.replace("MODEL", "T4"))
    created = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert created.returncode == 0, created.stderr
    assert "resourceslice.resource.k8s.io/node-a-gpus created" in created.stdout
    assert "pod/p1 created" in created.stdout
    assert (
        emulator.requests_for(method="POST", resource="resourceslices")[0].query["fieldValidation"]
        == "Strict"
    )

    manifest.write_text(MANIFEST.replace("MODEL", "A100"))
    updated = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert updated.returncode == 0, updated.stderr
    assert "resourceslice.resource.k8s.io/node-a-gpus configured" in updated.stdout
    assert "pod/p1 unchanged" in updated.stdout

    got = _kubectl(kubeconfig, "get", "resourceslice", "node-a-gpus", "-o", "json")
    assert got.returncode == 0, got.stderr
    slice_ = json.loads(got.stdout)
    assert slice_["spec"]["devices"][0]["attributes"]["model"] == {"string": "A100"}
    assert slice_["metadata"]["generation"] == 2
    listed = _kubectl(kubeconfig, "get", "pods", "-o", "name")
    assert listed.stdout.split() == ["pod/p1"]

    manifest.write_text(
        MANIFEST.replace("MODEL", "A100").replace("    capacity:", "    bogus: 1\n    capacity:")
    )
    refused = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert refused.returncode != 0
    assert 'unknown field "spec.devices[0].bogus"' in refused.stderr

    deleted = _kubectl(kubeconfig, "delete", "-f", str(manifest))
    assert deleted.returncode == 0, deleted.stderr
    assert emulator.get("resourceslices", "node-a-gpus") is None
    assert emulator.get("pods", "p1", "default") is None
