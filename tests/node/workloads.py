"""What the node tests create and read: pods whose container prints what it sees (its
environment, ``/dev``, its mounts) and then waits, and the waits on the API and on the node."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tests.apiserver.components import claims_path, create, delete, get, pod_path
from tests.cluster.controlplane import ControlPlane
from tests.cluster.images import BUSYBOX_IMAGE
from tests.cluster.node import wait_until

JSON = dict[str, Any]
DRIVER: Final = "gpu.biaxial.dev"
RESOURCE: Final = "/apis/resource.k8s.io/v1"
# the container's report: env, the device nodes, the mounts; then it waits to be deleted
REPORT: Final = (
    "echo '--- env'; env | sort; echo '--- dev'; ls /dev | sort; "
    "echo '--- caps'; ls /dev/nvidia-caps 2>/dev/null; echo '--- mounts'; cat /proc/mounts; "
    "echo '--- mps'; ls \"${CUDA_MPS_PIPE_DIRECTORY:-/none}\" 2>/dev/null; echo '--- end'; "
    "trap 'exit 0' TERM; while true; do sleep 1; done"
)


def namespace(plane: ControlPlane, name: str) -> str:
    if get(plane, f"/api/v1/namespaces/{name}") is None:
        create(plane, "/api/v1/namespaces", {"metadata": {"name": name}})
    return name


def container(name: str = "main", *, claims: Sequence[str] = (), **resources: Any) -> JSON:
    out: JSON = {
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", REPORT],
    }
    res: JSON = dict(resources)
    if claims:
        # "claim" or "claim/request" (KEP-3063: a container may use one request of a claim)
        res["claims"] = [
            {"name": c.split("/")[0], **({"request": c.split("/")[1]} if "/" in c else {})}
            for c in claims
        ]
    if res:
        out["resources"] = res
    return out


def pod(
    name: str,
    ns: str,
    containers: Sequence[JSON],
    *,
    claims: Mapping[str, Mapping[str, str]] | None = None,
) -> JSON:
    """A pod for the biaxial scheduler; ``claims`` maps each pod-level claim name to its
    source (``{"resourceClaimTemplateName": ...}`` or ``{"resourceClaimName": ...}``)."""
    spec: JSON = {
        "schedulerName": "biaxial",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "restartPolicy": "Never",
        "containers": list(containers),
    }
    if claims:
        spec["resourceClaims"] = [{"name": n, **src} for n, src in claims.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def claim_spec(requests: Sequence[JSON], config: Sequence[JSON] = ()) -> JSON:
    devices: JSON = {"requests": list(requests)}
    if config:
        devices["config"] = list(config)
    return {"devices": devices}


def gpu_config(strategy: str, requests: Sequence[str] = ()) -> JSON:
    """A claim's opaque GpuConfig choosing a sharing strategy (for ``requests``, or all)."""
    entry: JSON = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.biaxial.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": strategy},
            },
        }
    }
    if requests:
        entry["requests"] = list(requests)
    return entry


def request(name: str, **exactly: Any) -> JSON:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **exactly}}


def template(name: str, ns: str, requests: Sequence[JSON], config: Sequence[JSON] = ()) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": claim_spec(requests, config)},
    }


def claim(name: str, ns: str, requests: Sequence[JSON], config: Sequence[JSON] = ()) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": claim_spec(requests, config),
    }


def running(plane: ControlPlane, ns: str, name: str, timeout: float = 90.0) -> JSON:
    """The pod once Running (fails at once, with its status, when it failed)."""

    def check() -> JSON | None:
        stored = get(plane, pod_path(ns, name)) or {}
        phase = stored.get("status", {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {ns}/{name} {phase}: {json.dumps(stored['status'])}")
        return stored if phase == "Running" else None

    try:
        return dict(wait_until(check, timeout, f"pod {ns}/{name} Running"))
    except TimeoutError as err:
        stored = get(plane, pod_path(ns, name)) or {}
        raise AssertionError(f"{err}; status: {json.dumps(stored.get('status'))}") from err


def report(node: Any, ns: str, pod_name: str, container_name: str = "main") -> dict[str, list[str]]:
    """The container's report (``--- env`` ... ``--- end``) from its log: section -> lines."""
    text = wait_until(
        lambda: (
            (log := node.container_log(ns, pod_name, container_name)) and "--- end" in log and log
        ),
        30,
        f"{ns}/{pod_name}/{container_name} report",
    )
    sections: dict[str, list[str]] = {}
    current = ""
    for line in str(text).splitlines():
        if line.startswith("--- "):
            current = line[4:]
            sections[current] = []
        elif current:
            sections[current].append(line)
    return sections


def env_of(sections: Mapping[str, list[str]]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in sections["env"] if "=" in line)


def gpu_lines(sections: Mapping[str, list[str]]) -> list[str]:
    return [line for line in sections["dev"] if line.startswith("nvidia")]


def delete_and_wait(plane: ControlPlane, ns: str, name: str, timeout: float = 60.0) -> None:
    delete(plane, pod_path(ns, name))
    wait_until(lambda: get(plane, pod_path(ns, name)) is None, timeout, f"pod {ns}/{name} gone")


def claim_of(plane: ControlPlane, ns: str, pod_name: str, ref: str) -> JSON:
    """The ResourceClaim behind the pod's claim ``ref`` (generated from a template, or named)."""
    stored = get(plane, pod_path(ns, pod_name)) or {}
    for entry in stored.get("status", {}).get("resourceClaimStatuses") or []:
        if entry["name"] == ref and entry.get("resourceClaimName"):
            found = get(plane, claims_path(ns, entry["resourceClaimName"]))
            assert found is not None
            return found
    for entry in stored["spec"].get("resourceClaims") or []:
        if entry["name"] == ref and entry.get("resourceClaimName"):
            found = get(plane, claims_path(ns, entry["resourceClaimName"]))
            assert found is not None
            return found
    raise AssertionError(f"pod {ns}/{pod_name} has no claim {ref}")


def slice_devices(plane: ControlPlane, node: str) -> dict[str, JSON]:
    """The node's published devices by name."""
    status, body = plane.request("GET", f"{RESOURCE}/resourceslices")
    assert status == 200, body
    return {
        d["name"]: d
        for s in body["items"]
        if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices", [])
    }


def cdi_specs(cdi_dir: Path) -> dict[str, JSON]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}
