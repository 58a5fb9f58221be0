"""The ResourceSlice builder: discovered GPUs in, the node's ``resource.k8s.io/v1`` pool out.

Contract (DESIGN "Contracts"; reference §2.1, §5.6, §8):

* One pool per node, named after the node, published by ``driver_name``. Every slice selects the
  node by ``spec.nodeName`` and, when ``node_uid`` is given, is owned by the Node (controller
  owner reference) so it is garbage-collected with it.
* Devices: the published devices of the node's one device table
  (:class:`driver.discovery.devices.DeviceTable`, which decides names, order and which devices
  are published: a MIG-enabled GPU is published as its partitions). Attributes, capacities and
  request policies are exactly the contract's (see :func:`gpu_device` and :func:`mig_device`).
* Dynamic MIG (KEP-4815 partitionable devices): each dynamic GPU gets a counter set
  ``gpu-<minor>-mig`` (:class:`driver.discovery.mig.MigGeometry`); each of its placement
  devices consumes exactly its slots, compute slices and media engines, its whole-GPU device
  consumes all of them, so whole-GPU, share and MIG use of one GPU exclude each other through
  counters alone. A placement device has no ``uuid`` attribute (its instance does not exist
  until Prepare) and carries ``dynamicMig: true``, as the whole GPU does (a selector can keep
  a claim off dynamic GPUs); everything else equals a static MIG device's. The whole GPU
  carries the capacity of the full-size instance that backs it.
* The share cap (``max_shares``, the node's setting; ``None``: no cap) is published as a third
  capacity of every shareable GPU, ``shares``: its value is the cap, and its request policy
  (default ``1``, valid values ``[1]``) makes every allocation consume exactly one, so any
  allocator that implements DRA consumable capacity (kube-scheduler's too) gives a GPU at most
  ``max_shares`` claims at once. A claim cannot ask for more or less than one share: a request
  above 1 violates the policy and the device is skipped, a request below is rounded up to 1.
  ``memory`` and ``cores`` keep their meaning.
* Slices: devices are cut, in order, into slices of at most 128 devices (64 when any device of
  the pool uses taints, counters or list attributes); counter sets follow in slices of their
  own (the newest API's rule: a slice holds devices or counters), at most 8 sets each. Slice
  ``i`` (0-based) is named
  ``<node>-<driver>-<i as lower-case hex, at least 2 digits, same width for the whole pool>``;
  names sort in device order, which upstream's first-fit follows. If that name would exceed 253
  characters the node part is shortened and a hash of the full node name appended.
  ``resourceSliceCount`` is always the number of slices returned, ``generation`` as given.
* Versions are published as semver 2.0.0: ``"12.4"`` -> ``"12.4.0"``, ``"535.104.05"`` ->
  ``"535.104.5"`` (:func:`normalize_version`).
* The same input always gives equal output (and byte-identical JSON).
* Everything returned passes :func:`driver.api.validation.validate_pool` (the builder runs
  it), so a bug here is an error at build time, not a refusal by the API server.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from driver.api.errors import ValidationError
from driver.api.ids import DEFAULT_DRIVER_NAME, DriverName, NodeName, PoolName
from driver.api.model import (
    AttributeValue,
    Capacity,
    CounterSet,
    Device,
    DeviceTaint,
    Pool,
    RequestPolicy,
    ResourceSlice,
    ValidRange,
    Version,
)
from driver.api.quantity import Quantity
from driver.api.validation import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_ADVANCED,
    MAX_DRIVER_NAME_LENGTH,
    MAX_OBJECT_NAME_LENGTH,
    MAX_SHARED_COUNTER_SETS,
    SEMVER,
    check_subdomain,
    validate_pool,
)
from driver.discovery.devices import DeviceTable, NodeDevice
from driver.discovery.gpus import GpuInfo
from driver.discovery.mig import MigGeometry, counter_set_name

# --------------------------------------------------------------------------- contract names

STANDARD_DOMAIN: Final = "resource.kubernetes.io"
ATTR_PCI_BUS_ID: Final = f"{STANDARD_DOMAIN}/pciBusID"
ATTR_PCIE_ROOT: Final = f"{STANDARD_DOMAIN}/pcieRoot"
ATTR_NUMA_NODE: Final = f"{STANDARD_DOMAIN}/numaNode"
ATTR_DYNAMIC_MIG: Final = "dynamicMig"  # true on every device of a dynamic-MIG GPU
CAPACITY_MEMORY: Final = "memory"
CAPACITY_CORES: Final = "cores"
CAPACITY_SHARES: Final = "shares"
CORES_PER_GPU: Final = 100
MIB: Final = 1024 * 1024

_ONE_MIB: Final = Quantity.from_int(MIB, "BinarySI")
_ZERO: Final = Quantity.from_int(0)
_ONE: Final = Quantity.from_int(1)
_HUNDRED: Final = Quantity.from_int(CORES_PER_GPU)
_CORES_CAPACITY: Final = Capacity(
    value=_HUNDRED,
    request_policy=RequestPolicy(
        default=_ZERO, valid_range=ValidRange(min=_ZERO, max=_HUNDRED, step=_ONE)
    ),
)


_NUMERIC_VERSION: Final = re.compile(r"v?(\d+(?:\.\d+)*)")


# --------------------------------------------------------------------------- versions and names


def normalize_version(text: str) -> str:
    """Turn an NVIDIA version string into semver 2.0.0 text.

    Numeric dotted versions get leading zeros stripped and are padded to three components
    (``"12.4"`` -> ``"12.4.0"``, ``"535.104.05"`` -> ``"535.104.5"``); components beyond the
    third become build metadata (``"1.2.3.4"`` -> ``"1.2.3+4"``). Text that is already valid
    semver is returned unchanged. Anything else raises :class:`ValidationError`.
    """
    if SEMVER.fullmatch(text):
        return text
    match = _NUMERIC_VERSION.fullmatch(text.strip())
    if match is None:
        raise ValidationError(f"version {text!r} cannot be expressed as semver 2.0.0")
    parts = [str(int(p)) for p in match.group(1).split(".")]
    core = [*parts, "0", "0"][:3]
    extra = parts[3:]
    return ".".join(core) + (f"+{'.'.join(extra)}" if extra else "")


def slice_name(node_name: str, driver_name: str, index: int, width: int = 2) -> str:
    """``<node>-<driver>-<index in hex, zero-padded to width>``, shortened to fit 253 chars."""
    suffix = f"-{driver_name}-{index:0{width}x}"
    name = f"{node_name}{suffix}"
    if len(name) <= MAX_OBJECT_NAME_LENGTH:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_OBJECT_NAME_LENGTH - len(suffix) - len(digest) - 1
    return f"{node_name[:keep].rstrip('.-')}-{digest}{suffix}"


# --------------------------------------------------------------------------- devices


def _common_attributes(gpu: GpuInfo) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "index": gpu.index,
        "minor": gpu.minor,
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": Version(normalize_version(gpu.cuda_compute_capability)),
        "driverVersion": Version(normalize_version(gpu.driver_version)),
        "cudaDriverVersion": Version(normalize_version(gpu.cuda_driver_version)),
    }
    if gpu.pci_bus_id is not None:
        attrs[ATTR_PCI_BUS_ID] = gpu.pci_bus_id
    if gpu.pcie_root is not None:
        attrs[ATTR_PCIE_ROOT] = gpu.pcie_root
    if gpu.numa_node is not None:
        attrs[ATTR_NUMA_NODE] = gpu.numa_node
    return attrs


def _memory_quantity(memory_bytes: int) -> Quantity:
    """Whole MiB (NVML totals are; a stray remainder is dropped so 1Mi steps divide it)."""
    return Quantity.from_int(memory_bytes - memory_bytes % MIB, "BinarySI")


def _consumes(device: NodeDevice) -> tuple[CounterSet, ...]:
    """A dynamic device's counter consumption (nothing for a static one)."""
    if device.placement is None:
        return ()
    geometry = MigGeometry.of(device.gpu)
    amounts = geometry.totals if not device.is_mig else geometry.consumes(device.placement)
    return (
        CounterSet(
            name=counter_set_name(device.gpu.minor),
            counters={k: Quantity.from_int(v) for k, v in amounts.items()},
        ),
    )


def counter_sets(devices: DeviceTable) -> tuple[CounterSet, ...]:
    """The counter set of every dynamic GPU that has a published device, by minor."""
    out = []
    for gpu in devices.dynamic_gpus:
        if not any(d.published and d.gpu.uuid == gpu.uuid for d in devices.devices):
            continue
        totals = MigGeometry.of(gpu).totals
        out.append(
            CounterSet(
                name=counter_set_name(gpu.minor),
                counters={k: Quantity.from_int(v) for k, v in totals.items()},
            )
        )
    return tuple(out)


def shares_capacity(max_shares: int) -> Capacity:
    """The ``shares`` capacity of a shareable GPU under a cap of ``max_shares`` claims: every
    allocation consumes exactly one (default 1, valid values ``[1]``)."""
    if max_shares < 1:
        raise ValidationError(f"the share cap must be at least 1, got {max_shares}")
    return Capacity(
        value=Quantity.from_int(max_shares),
        request_policy=RequestPolicy(default=_ONE, valid_values=(_ONE,)),
    )


@functools.lru_cache(maxsize=256)
def _memory_capacity(memory: Quantity) -> Capacity:
    """A shareable GPU's ``memory``: all of it by default, in 1Mi steps from 1Mi (one object
    per GPU model, shared by its devices)."""
    return Capacity(
        value=memory,
        request_policy=RequestPolicy(
            default=memory, valid_range=ValidRange(min=_ONE_MIB, max=memory, step=_ONE_MIB)
        ),
    )


def gpu_device(
    device: NodeDevice, taints: tuple[DeviceTaint, ...] = (), max_shares: int | None = None
) -> Device:
    """A whole, shareable GPU: ``allowMultipleAllocations`` with memory and cores policies.

    ``memory`` defaults to the whole GPU (a claim naming no capacity gets it to itself) and may
    be requested in 1Mi steps from 1Mi; ``cores`` (percent of the GPU's SMs, 100 in all)
    defaults to 0 and may be requested in steps of 1. On a dynamic-MIG GPU the device stands
    for the full-size instance (its memory and SMs) and consumes the GPU's whole counter set.
    With ``max_shares``, a shareable GPU also has the ``shares`` capacity
    (:func:`shares_capacity`).
    """
    gpu = device.gpu
    memory = _memory_quantity(device.memory_bytes)
    if memory < _ONE_MIB:
        raise ValidationError(f"GPU {gpu.uuid}: memory {device.memory_bytes} bytes is below 1Mi")
    attrs = {"type": "gpu", "uuid": gpu.uuid, **_common_attributes(gpu)}
    attrs["multiprocessors"] = device.multiprocessors
    if device.dynamic:
        attrs[ATTR_DYNAMIC_MIG] = True
    shares = (
        {CAPACITY_SHARES: shares_capacity(max_shares)}
        if max_shares is not None and device.shareable
        else {}
    )
    return Device(
        name=device.name,
        attributes=attrs,
        capacity={
            CAPACITY_MEMORY: _memory_capacity(memory),
            CAPACITY_CORES: _CORES_CAPACITY,
            **shares,
        },
        allow_multiple_allocations=device.shareable,
        consumes_counters=_consumes(device),
        taints=taints,
    )


def mig_device(device: NodeDevice, taints: tuple[DeviceTaint, ...] = ()) -> Device:
    """A MIG partition: exclusive, with its memory and its SM share as ``cores``.

    ``index``, ``minor`` and the PCI/NUMA attributes are the parent's; ``multiprocessors`` is the
    partition's SM count and ``cores`` is ``floor(100 * partition SMs / parent SMs)``. A dynamic
    placement has the same attributes but ``uuid`` (its instance does not exist yet) and
    consumes its counters.
    """
    gpu = device.gpu
    if not device.is_mig or (device.mig is None and device.placement is None):
        raise ValueError(f"device {device.name} is not a MIG partition")
    if gpu.multiprocessors <= 0:
        raise ValidationError(f"GPU {gpu.uuid}: multiprocessor count must be positive")
    sms = device.multiprocessors
    cores = min(CORES_PER_GPU, CORES_PER_GPU * sms // gpu.multiprocessors)
    attrs: dict[str, AttributeValue] = {"type": "mig"}
    if device.placement is None:
        attrs["uuid"] = device.uuid
    attrs.update(_common_attributes(gpu))
    attrs["multiprocessors"] = sms
    attrs["profile"] = device.profile
    attrs["parentUUID"] = gpu.uuid
    if device.dynamic:
        attrs[ATTR_DYNAMIC_MIG] = True
    return Device(
        name=device.name,
        attributes=attrs,
        capacity={
            CAPACITY_MEMORY: Capacity(value=_memory_quantity(device.memory_bytes)),
            CAPACITY_CORES: Capacity(value=Quantity.from_int(cores)),
        },
        allow_multiple_allocations=device.shareable,
        consumes_counters=_consumes(device),
        taints=taints,
    )


def build_devices(
    devices: DeviceTable,
    taints: Mapping[str, tuple[DeviceTaint, ...]] | None = None,
    max_shares: int | None = None,
) -> tuple[Device, ...]:
    """The table's published devices as API devices, in publishing order."""
    taints = taints or {}
    out = tuple(
        mig_device(d, tuple(taints.get(d.name, ())))
        if d.is_mig
        else gpu_device(d, tuple(taints.get(d.name, ())), max_shares)
        for d in devices.published
    )
    unknown = sorted(set(taints) - {d.name for d in out})
    if unknown:
        raise ValidationError(
            f"taints given for devices this node does not have: {', '.join(unknown)}"
        )
    return out


# --------------------------------------------------------------------------- slices


def build_slices(
    inventory: DeviceTable | Iterable[GpuInfo],
    *,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER_NAME,
    generation: int = 1,
    node_uid: str | None = None,
    taints: Mapping[str, tuple[DeviceTaint, ...]] | None = None,
    max_shares: int | None = None,
    validate: bool = True,
) -> list[ResourceSlice]:
    """The node's pool as ResourceSlices (see the module docstring for every rule).

    ``inventory`` is the node's device table, or the discovered GPUs it is derived from. A node
    without GPUs gets one empty slice, so the pool exists and is complete with zero devices
    (consumers then know the node has nothing rather than "not yet published").
    ``validate=False`` skips the final :func:`~driver.api.validation.validate_pool` for a
    caller that builds many nodes from one GPU model whose pool it has validated (the
    simulator: only names and UUIDs differ between such nodes, and the names are checked
    here regardless).
    """
    check_subdomain(node_name, "node name", MAX_OBJECT_NAME_LENGTH)
    check_subdomain(driver_name, "driver name", MAX_DRIVER_NAME_LENGTH)
    if generation < 0:
        raise ValidationError(f"pool generation must be >= 0, got {generation}")
    table = DeviceTable.of(inventory)
    devices = build_devices(table, taints, max_shares)
    sets = counter_sets(table)
    limit = (
        MAX_DEVICES_PER_SLICE_ADVANCED
        if any(d.uses_advanced_features for d in devices)
        else MAX_DEVICES_PER_SLICE
    )
    chunks: list[tuple[Sequence[Device], Sequence[CounterSet]]] = [
        (devices[i : i + limit], ()) for i in range(0, len(devices), limit)
    ]
    chunks += [
        ((), sets[i : i + MAX_SHARED_COUNTER_SETS])
        for i in range(0, len(sets), MAX_SHARED_COUNTER_SETS)
    ]
    chunks = chunks or [((), ())]
    width = max(2, len(f"{len(chunks) - 1:x}"))
    owners: tuple[dict[str, object], ...] = ()
    if node_uid:
        owners = (
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_uid,
                "controller": True,
            },
        )
    pool = Pool(name=PoolName(node_name), generation=generation, resource_slice_count=len(chunks))
    slices = [
        ResourceSlice(
            name=slice_name(node_name, driver_name, i, width),
            driver=DriverName(driver_name),
            pool=pool,
            devices=tuple(chunk),
            shared_counters=tuple(counters),
            node_name=NodeName(node_name),
            owner_references=owners,
        )
        for i, (chunk, counters) in enumerate(chunks)
    ]
    if validate:
        validate_pool(slices)
    return slices
