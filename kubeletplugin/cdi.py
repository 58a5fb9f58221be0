"""CDI (Container Device Interface, spec 1.1.0) specs for prepared claims.

Two halves:

* **Pure computation** (:func:`build_claim_spec`): from the devices a claim was allocated on
  this node, with the sharing strategy and limits of each, compute one transient CDI spec and
  the CDI device IDs of every allocation result. No I/O; same input, same output.
* **Files** (:func:`write_spec`, :func:`remove_spec`): write a spec atomically (temp file,
  fsync, rename, fsync directory) and remove it; both idempotent.

Layout of a claim's spec (kind ``k8s.<driver>/gpu``, file ``k8s.<driver>-gpu_<claimUID>.json``,
CDI's transient spec naming):

* spec-level ``containerEdits``: the control device nodes every GPU container needs
  (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``);
* one CDI device per allocation result, named ``<claimUID>-<device>`` (a second result on the
  same device, a second share, gets ``-<result index>``), carrying the GPU's device node, for
  a MIG instance also its two capability nodes (``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU
  and compute instance, without which a container cannot open it), and the environment and
  mounts of its **container set**.

A container set is what the kubelet hands one container: the devices of one request (it
matches ``resources.claims[].request`` against each device's ``request_names``). Every device
of a set carries the same, complete environment for the set, so the merge order of CDI edits
does not matter: ``NVIDIA_VISIBLE_DEVICES`` (UUIDs), ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and
``CUDA_VISIBLE_DEVICES`` (in-container indices ``0..n-1``, GPUs ordered by PCI bus ID, then
device name), and the sharing limits indexed by that order. A container that names no request
of a multi-request claim receives several sets and therefore conflicting values; see
``docs/sharing.md``.

``cdiVersion`` is the smallest version the content needs (:func:`minimum_cdi_version`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from driver.api.errors import PrepareError
from driver.discovery.devices import NodeDevice
from kubeletplugin import sharing
from kubeletplugin.sharing import ContainerSet, DeviceAllocation, SharingPaths

JSON = dict[str, Any]

CDI_CLASS: Final = "gpu"
CONTROL_DEVICE_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

_NAME_OK: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9]|[A-Za-z0-9]")


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """The computed spec of one claim: file name, content, and each result's CDI device IDs
    (in the order of the allocations given)."""

    file_name: str
    spec: JSON
    cdi_device_ids: tuple[tuple[str, ...], ...]
    host_dirs: tuple[str, ...] = ()  # writable host directories the mounts need to exist


def cdi_vendor(driver: str) -> str:
    return f"k8s.{driver}"


def cdi_kind(driver: str) -> str:
    """``k8s.gpu.biaxial.dev/gpu`` for the default driver name."""
    return f"{cdi_vendor(driver)}/{CDI_CLASS}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """CDI transient spec name: ``<vendor>-<class>_<claimUID>.json``."""
    return f"{cdi_vendor(driver)}-{CDI_CLASS}_{claim_uid}.json"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _edits_need(edits: Mapping[str, Any]) -> str:
    need = "0.3.0"
    if any("type" in m for m in edits.get("mounts", ())):
        need = "0.4.0"
    if any("hostPath" in d for d in edits.get("deviceNodes", ())):
        need = "0.5.0"
    if edits.get("additionalGids") or edits.get("intelRdt"):
        need = "0.7.0"
    if edits.get("netDevices"):
        need = "1.1.0"
    return need


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The smallest CDI spec version that can load ``spec``: 0.3.0 baseline; 0.4.0 for mount
    types; 0.5.0 for device-node host paths and device names starting with a digit; 0.6.0 for
    annotations; 0.7.0 for additional GIDs / Intel RDT; 1.1.0 for network devices."""
    needs = [_edits_need(spec.get("containerEdits") or {})]
    if spec.get("annotations"):
        needs.append("0.6.0")
    for device in spec.get("devices", ()):
        needs.append(_edits_need(device.get("containerEdits") or {}))
        if device.get("annotations"):
            needs.append("0.6.0")
        if device["name"][:1].isdigit():
            needs.append("0.5.0")
    return max(needs, key=_version_key)


def _base_request(request: str) -> str:
    return request.split("/", 1)[0]


def _sort_key(target: NodeDevice) -> tuple[str, str]:
    return ((target.pci_bus_id or "").lower(), target.name)


def _set_edits(
    allocations: Sequence[DeviceAllocation], paths: SharingPaths, request: str, claim_uid: str
) -> tuple[list[str], sharing.Edits]:
    """Environment and the strategy's edits of one container set (the results of one
    request)."""
    # One in-container GPU per physical target; two shares of one GPU add up.
    by_uuid: dict[str, list[DeviceAllocation]] = {}
    for alloc in allocations:
        by_uuid.setdefault(alloc.target.container_uuid, []).append(alloc)
    targets = sorted((group[0].target for group in by_uuid.values()), key=_sort_key)
    strategies = {a.strategy for a in allocations}
    if len(strategies) != 1:
        raise PrepareError(
            f"request {request!r}: its devices use different sharing strategies "
            f"({', '.join(sorted(strategies))})"
        )
    env = [
        "NVIDIA_VISIBLE_DEVICES=" + ",".join(t.container_uuid for t in targets),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(len(targets))),
    ]
    shares = ContainerSet(
        request=request,
        claim_uid=claim_uid,
        targets=tuple(targets),
        shares={uuid: tuple(group) for uuid, group in by_uuid.items()},
    )
    strategy = sharing.strategy(strategies.pop())
    strategy.check(shares, paths)
    return env, strategy.edits(shares, paths)


def device_nodes(target: NodeDevice) -> list[JSON]:
    """The GPU's device node and, for a MIG instance, its two capability nodes. Raises
    PrepareError for a MIG instance whose capability nodes are unknown: the container could
    not open it."""
    nodes: list[JSON] = [{"path": f"/dev/nvidia{target.minor}"}]
    if target.mig is None:
        return nodes
    if not target.mig.caps:
        raise PrepareError(
            f"MIG device {target.name!r} ({target.mig.uuid}): its /dev/nvidia-caps nodes are "
            "unknown (the plugin could not read /proc/driver/nvidia/capabilities); a container "
            "could not open it"
        )
    return nodes + [{"path": cap} for cap in target.mig.caps]


def _on_host(nodes: list[JSON], device_dir: Path | None) -> list[JSON]:
    """``nodes`` with each one's stand-in under ``device_dir`` as its ``hostPath`` (none:
    unchanged, the host's ``/dev`` node is the container's)."""
    if device_dir is None:
        return nodes
    return [
        {**node, "hostPath": str(device_dir / str(node["path"]).removeprefix("/dev/"))}
        for node in nodes
    ]


def build_claim_spec(
    driver: str, claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
) -> ClaimSpec:
    """Compute the CDI spec of one claim. Raises :class:`PrepareError` for a combination the
    container cannot be given correctly (mixed strategies in one request, MPS across GPUs,
    hami-core without its library, sharing on MIG)."""
    if not allocations:
        raise PrepareError(f"claim {claim_uid}: no devices of driver {driver} on this node")
    sets: dict[str, list[DeviceAllocation]] = {}
    for alloc in allocations:
        sets.setdefault(_base_request(alloc.request), []).append(alloc)
    set_edits = {req: _set_edits(allocs, paths, req, claim_uid) for req, allocs in sets.items()}

    devices: list[JSON] = []
    ids: list[tuple[str, ...]] = []
    used: set[str] = set()
    kind = cdi_kind(driver)
    for index, alloc in enumerate(allocations):
        name = f"{claim_uid}-{alloc.target.name}"
        if name in used:
            name = f"{name}-{index}"
        used.add(name)
        if not _NAME_OK.fullmatch(name):
            raise PrepareError(f"claim {claim_uid}: {name!r} is not a valid CDI device name")
        env, extra = set_edits[_base_request(alloc.request)]
        try:
            nodes = device_nodes(alloc.target)
        except PrepareError as exc:
            raise PrepareError(f"claim {claim_uid}: {exc}") from exc
        edits: JSON = {"env": [*env, *extra.env], "deviceNodes": _on_host(nodes, paths.device_dir)}
        if extra.mounts:
            edits["mounts"] = [dict(m) for m in extra.mounts]
        devices.append({"name": name, "containerEdits": edits})
        ids.append((f"{kind}={name}",))
    spec: JSON = {
        "cdiVersion": "",
        "kind": kind,
        "devices": devices,
        "containerEdits": {
            "deviceNodes": _on_host([{"path": p} for p in CONTROL_DEVICE_NODES], paths.device_dir)
        },
    }
    spec["cdiVersion"] = minimum_cdi_version(spec)
    host_dirs = sorted({d for _, extra in set_edits.values() for d in extra.host_dirs})
    return ClaimSpec(
        file_name=spec_file_name(driver, claim_uid),
        spec=spec,
        cdi_device_ids=tuple(ids),
        host_dirs=tuple(host_dirs),
    )


# --------------------------------------------------------------------------- files


def encode_spec(spec: Mapping[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new content, never a mix:
    temp file in the same directory, fsync, rename over, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(mode)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def write_spec(cdi_dir: Path, claim_spec: ClaimSpec) -> Path:
    """Write (or rewrite) a claim's spec file atomically; returns its path. Idempotent."""
    path = cdi_dir / claim_spec.file_name
    atomic_write(path, encode_spec(claim_spec.spec))
    return path


def rewrite_spec(cdi_dir: Path, file_name: str, spec: Mapping[str, Any]) -> Path:
    """Write a spec the checkpoint recorded (file name and content) again. Idempotent."""
    return write_spec(cdi_dir, ClaimSpec(file_name=file_name, spec=dict(spec), cdi_device_ids=()))


def remove_spec(cdi_dir: Path, file_name: str) -> bool:
    """Remove a claim's spec file; True if it existed. Idempotent; an empty name (a record
    migrated from a checkpoint that did not know its spec file) removes nothing."""
    if not file_name:
        return False
    if "/" in file_name or file_name.startswith("."):
        raise ValueError(f"{file_name!r} is not a CDI spec file name")
    path = cdi_dir / file_name
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(cdi_dir)
    return True


def spec_present(cdi_dir: Path, file_name: str, spec: Mapping[str, Any]) -> bool:
    """True if the file exists with exactly this content."""
    try:
        return (cdi_dir / file_name).read_bytes() == encode_spec(spec)
    except FileNotFoundError:
        return False
