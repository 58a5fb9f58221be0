"""The ResourceSlice builder: discovered GPUs in, the node's ``resource.k8s.io/v1`` pool out.

Contract (DESIGN "Contracts"; reference §2.1, §5.6, §8):

* One pool per node, named after the node, published by ``driver_name``. Every slice selects the
  node by ``spec.nodeName`` and, when ``node_uid`` is given, is owned by the Node (controller
  owner reference) so it is garbage-collected with it.
* Devices: ``gpu-<minor>`` for a whole GPU; when MIG is enabled on a GPU its partitions
  ``gpu-<minor>-mig-<profile without dots>-<start>`` are published *instead of* the parent.
  Order: by parent minor, then placement start. Attributes, capacities and request policies are
  exactly the contract's (see :func:`gpu_device` and :func:`mig_device`).
* Slices: devices are cut, in order, into slices of at most 128 devices (64 when any device of
  the pool uses taints, counters or list attributes). Slice ``i`` (0-based) is named
  ``<node>-<driver>-<i as lower-case hex, at least 2 digits, same width for the whole pool>``;
  names sort in device order, which upstream's first-fit follows. If that name would exceed 253
  characters the node part is shortened and a hash of the full node name appended.
  ``resourceSliceCount`` is always the number of slices returned, ``generation`` as given.
* Versions are published as semver 2.0.0: ``"12.4"`` -> ``"12.4.0"``, ``"535.104.05"`` ->
  ``"535.104.5"`` (:func:`normalize_version`).
* The same input always gives equal output (and byte-identical JSON).
* :func:`validate_slice` and :func:`validate_pool` check the API limits the OpenAPI schema does
  not (attribute count and name lengths, value lengths, device-name format and uniqueness,
  per-slice device limits, taint count, request-policy consistency) and raise
  :class:`~driver.errors.ValidationError` naming the slice, device and field. The builder runs
  both on everything it returns. Neither function mutates its input.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from driver import DEFAULT_DRIVER_NAME
from driver.errors import ValidationError
from driver.ids import DriverName, NodeName, PoolName
from driver.model import (
    AttributeValue,
    Capacity,
    Device,
    DeviceTaint,
    GpuInfo,
    MigInfo,
    Pool,
    RequestPolicy,
    ResourceSlice,
    ValidRange,
    Version,
)
from driver.quantity import Quantity

# --------------------------------------------------------------------------- API limits (§2.1)

MAX_DEVICES_PER_SLICE: Final = 128
MAX_DEVICES_PER_SLICE_ADVANCED: Final = 64
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_ATTRIBUTE_VALUES: Final = 48
MAX_ID_LENGTH: Final = 32
MAX_DOMAIN_LENGTH: Final = 63
MAX_VALUE_LENGTH: Final = 64
MAX_TAINTS: Final = 16
MAX_SHARED_COUNTER_SETS: Final = 8
MAX_CONSUMES_COUNTERS: Final = 2
MAX_COUNTERS_PER_SET: Final = 32
MAX_DRIVER_NAME_LENGTH: Final = 63
MAX_POOL_NAME_LENGTH: Final = 253
MAX_OBJECT_NAME_LENGTH: Final = 253
MAX_LABEL_LENGTH: Final = 63
TAINT_EFFECTS: Final = frozenset({"None", "NoSchedule", "NoExecute"})

# --------------------------------------------------------------------------- contract names

STANDARD_DOMAIN: Final = "resource.kubernetes.io"
ATTR_PCI_BUS_ID: Final = f"{STANDARD_DOMAIN}/pciBusID"
ATTR_PCIE_ROOT: Final = f"{STANDARD_DOMAIN}/pcieRoot"
ATTR_NUMA_NODE: Final = f"{STANDARD_DOMAIN}/numaNode"
CAPACITY_MEMORY: Final = "memory"
CAPACITY_CORES: Final = "cores"
CORES_PER_GPU: Final = 100
MIB: Final = 1024 * 1024

_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_C_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SEMVER: Final = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_NUMERIC_VERSION: Final = re.compile(r"v?(\d+(?:\.\d+)*)")

_ONE_MIB: Final = Quantity.from_int(MIB, "BinarySI")
_ZERO: Final = Quantity.from_int(0)
_ONE: Final = Quantity.from_int(1)
_HUNDRED: Final = Quantity.from_int(CORES_PER_GPU)


# --------------------------------------------------------------------------- names and versions


def gpu_device_name(minor: int) -> str:
    """``gpu-<minor>``."""
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, start: int) -> str:
    """``gpu-<minor>-mig-<profile without dots>-<start>``, e.g. ``gpu-0-mig-1g5gb-3``.

    Profile characters other than lower-case letters and digits are dropped (``1g.5gb+me`` ->
    ``1g5gbme``) so the name stays a DNS label.
    """
    compact = re.sub(r"[^a-z0-9]", "", profile.lower())
    return f"gpu-{parent_minor}-mig-{compact}-{start}"


def normalize_version(text: str) -> str:
    """Turn an NVIDIA version string into semver 2.0.0 text.

    Numeric dotted versions get leading zeros stripped and are padded to three components
    (``"12.4"`` -> ``"12.4.0"``, ``"535.104.05"`` -> ``"535.104.5"``); components beyond the
    third become build metadata (``"1.2.3.4"`` -> ``"1.2.3+4"``). Text that is already valid
    semver is returned unchanged. Anything else raises :class:`ValidationError`.
    """
    if _SEMVER.fullmatch(text):
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


def gpu_device(gpu: GpuInfo, taints: tuple[DeviceTaint, ...] = ()) -> Device:
    """A whole, shareable GPU: ``allowMultipleAllocations`` with memory and cores policies.

    ``memory`` defaults to the whole GPU (a claim naming no capacity gets it to itself) and may
    be requested in 1Mi steps from 1Mi; ``cores`` (percent of the GPU's SMs, 100 in all)
    defaults to 0 and may be requested in steps of 1.
    """
    memory = _memory_quantity(gpu.memory_bytes)
    if memory < _ONE_MIB:
        raise ValidationError(f"GPU {gpu.uuid}: memory {gpu.memory_bytes} bytes is below 1Mi")
    attrs = {"type": "gpu", "uuid": gpu.uuid, **_common_attributes(gpu)}
    attrs["multiprocessors"] = gpu.multiprocessors
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=attrs,
        capacity={
            CAPACITY_MEMORY: Capacity(
                value=memory,
                request_policy=RequestPolicy(
                    default=memory,
                    valid_range=ValidRange(min=_ONE_MIB, max=memory, step=_ONE_MIB),
                ),
            ),
            CAPACITY_CORES: Capacity(
                value=_HUNDRED,
                request_policy=RequestPolicy(
                    default=_ZERO,
                    valid_range=ValidRange(min=_ZERO, max=_HUNDRED, step=_ONE),
                ),
            ),
        },
        allow_multiple_allocations=True,
        taints=taints,
    )


def mig_device(gpu: GpuInfo, mig: MigInfo, taints: tuple[DeviceTaint, ...] = ()) -> Device:
    """An existing MIG partition: exclusive, with its memory and its SM share as ``cores``.

    ``index``, ``minor`` and the PCI/NUMA attributes are the parent's; ``multiprocessors`` is the
    partition's SM count and ``cores`` is ``floor(100 * partition SMs / parent SMs)``.
    """
    if gpu.multiprocessors <= 0:
        raise ValidationError(f"GPU {gpu.uuid}: multiprocessor count must be positive")
    cores = min(CORES_PER_GPU, CORES_PER_GPU * mig.multiprocessors // gpu.multiprocessors)
    attrs = {"type": "mig", "uuid": mig.uuid, **_common_attributes(gpu)}
    attrs["multiprocessors"] = mig.multiprocessors
    attrs["profile"] = mig.profile
    attrs["parentUUID"] = gpu.uuid
    return Device(
        name=mig_device_name(gpu.minor, mig.profile, mig.start),
        attributes=attrs,
        capacity={
            CAPACITY_MEMORY: Capacity(value=_memory_quantity(mig.memory_bytes)),
            CAPACITY_CORES: Capacity(value=Quantity.from_int(cores)),
        },
        taints=taints,
    )


def build_devices(
    gpus: Iterable[GpuInfo],
    taints: Mapping[str, tuple[DeviceTaint, ...]] | None = None,
) -> tuple[Device, ...]:
    """All devices of a node in publishing order (parent minor, then MIG placement start)."""
    taints = taints or {}
    devices: list[Device] = []
    for gpu in sorted(gpus, key=lambda g: g.minor):
        if gpu.mig_enabled:
            for mig in sorted(gpu.mig_devices, key=lambda m: m.start):
                name = mig_device_name(gpu.minor, mig.profile, mig.start)
                devices.append(mig_device(gpu, mig, tuple(taints.get(name, ()))))
        else:
            name = gpu_device_name(gpu.minor)
            devices.append(gpu_device(gpu, tuple(taints.get(name, ()))))
    unknown = sorted(set(taints) - {d.name for d in devices})
    if unknown:
        raise ValidationError(
            f"taints given for devices this node does not have: {', '.join(unknown)}"
        )
    return tuple(devices)


# --------------------------------------------------------------------------- slices


def build_slices(
    gpus: Iterable[GpuInfo],
    *,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER_NAME,
    generation: int = 1,
    node_uid: str | None = None,
    taints: Mapping[str, tuple[DeviceTaint, ...]] | None = None,
) -> list[ResourceSlice]:
    """The node's pool as ResourceSlices (see the module docstring for every rule).

    A node without GPUs gets one empty slice, so the pool exists and is complete with zero
    devices (consumers then know the node has nothing rather than "not yet published").
    """
    _check_subdomain(node_name, "node name", MAX_OBJECT_NAME_LENGTH)
    _check_subdomain(driver_name, "driver name", MAX_DRIVER_NAME_LENGTH)
    if generation < 0:
        raise ValidationError(f"pool generation must be >= 0, got {generation}")
    devices = build_devices(gpus, taints)
    limit = (
        MAX_DEVICES_PER_SLICE_ADVANCED
        if any(d.uses_advanced_features for d in devices)
        else MAX_DEVICES_PER_SLICE
    )
    chunks: list[Sequence[Device]] = [
        devices[i : i + limit] for i in range(0, len(devices), limit)
    ] or [()]
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
            node_name=NodeName(node_name),
            owner_references=owners,
        )
        for i, chunk in enumerate(chunks)
    ]
    validate_pool(slices)
    return slices


# --------------------------------------------------------------------------- validation


def _check_subdomain(value: str, what: str, max_length: int) -> None:
    if not value or len(value) > max_length or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValidationError(
            f"{what} {value!r} must be a lower-case DNS subdomain of at most {max_length} "
            "characters (letters, digits, '-' and '.', starting and ending alphanumeric)"
        )


def _check_label(value: str, what: str) -> None:
    if not value or len(value) > MAX_LABEL_LENGTH or not _DNS_LABEL.fullmatch(value):
        raise ValidationError(
            f"{what} {value!r} must be a DNS label: at most {MAX_LABEL_LENGTH} lower-case "
            "letters, digits and '-', starting and ending alphanumeric"
        )


def check_qualified_name(key: str, where: str) -> None:
    """A QualifiedName: ``<C identifier>`` or ``<DNS subdomain>/<C identifier>`` (§2.1)."""
    domain, sep, ident = key.rpartition("/")
    if sep and (len(domain) > MAX_DOMAIN_LENGTH or not _DNS_SUBDOMAIN.fullmatch(domain)):
        raise ValidationError(
            f"{where}: domain {domain!r} of {key!r} must be a DNS subdomain of at most "
            f"{MAX_DOMAIN_LENGTH} characters"
        )
    if len(ident) > MAX_ID_LENGTH or not _C_IDENTIFIER.fullmatch(ident):
        raise ValidationError(
            f"{where}: name {ident!r} of {key!r} must be a C identifier of at most "
            f"{MAX_ID_LENGTH} characters"
        )


def _check_value(value: AttributeValue, where: str) -> int:
    """Check one attribute value; return how many individual values it holds."""
    items: tuple[object, ...] = value if isinstance(value, tuple) else (value,)
    if not items:
        raise ValidationError(f"{where}: list attributes must not be empty")
    for item in items:
        if isinstance(item, str) and len(item) > MAX_VALUE_LENGTH:
            raise ValidationError(f"{where}: string longer than {MAX_VALUE_LENGTH} characters")
        if isinstance(item, Version):
            if len(item.text) > MAX_VALUE_LENGTH:
                raise ValidationError(f"{where}: version longer than {MAX_VALUE_LENGTH} characters")
            if not _SEMVER.fullmatch(item.text):
                raise ValidationError(f"{where}: version {item.text!r} is not semver 2.0.0")
    return len(items)


def _check_capacity(name: str, cap: Capacity, device: Device, where: str) -> None:
    if cap.value.sign() < 0:
        raise ValidationError(f"{where}: capacity {name!r} must not be negative")
    policy = cap.request_policy
    if policy is None:
        return
    if not device.allow_multiple_allocations:
        raise ValidationError(
            f"{where}: capacity {name!r} has a requestPolicy but the device does not set "
            "allowMultipleAllocations"
        )
    if policy.valid_values and policy.valid_range is not None:
        raise ValidationError(
            f"{where}: capacity {name!r}: set validValues or validRange, not both"
        )
    if policy.valid_values:
        values = list(policy.valid_values)
        if values != sorted(values) or len(set(values)) != len(values) or len(values) > 10:
            raise ValidationError(
                f"{where}: capacity {name!r}: validValues must be at most 10, strictly ascending"
            )
        if policy.default is not None and policy.default not in values:
            raise ValidationError(f"{where}: capacity {name!r}: validValues must contain default")
        if values[-1] > cap.value:
            raise ValidationError(f"{where}: capacity {name!r}: a valid value exceeds the capacity")
    rng = policy.valid_range
    if rng is not None:
        if rng.min.sign() < 0 or rng.min > cap.value:
            raise ValidationError(f"{where}: capacity {name!r}: validRange.min must be 0..value")
        if rng.max is not None and (rng.max > cap.value or rng.max < rng.min):
            raise ValidationError(f"{where}: capacity {name!r}: validRange.max must be min..value")
        if policy.default is not None and policy.default < rng.min:
            raise ValidationError(f"{where}: capacity {name!r}: default is below validRange.min")
        if policy.default is not None and rng.max is not None and policy.default > rng.max:
            raise ValidationError(f"{where}: capacity {name!r}: default is above validRange.max")
        if rng.step is not None:
            step = rng.step.nanos
            if step <= 0:
                raise ValidationError(f"{where}: capacity {name!r}: validRange.step must be > 0")
            if rng.min.nanos + step > cap.value.nanos:
                raise ValidationError(
                    f"{where}: capacity {name!r}: validRange.min + step exceeds the capacity"
                )
            for label, q in (("max", rng.max), ("default", policy.default)):
                if q is not None and (q.nanos - rng.min.nanos) % step:
                    raise ValidationError(
                        f"{where}: capacity {name!r}: {label} is not min plus a multiple of step"
                    )
    if policy.default is not None and policy.default > cap.value:
        raise ValidationError(f"{where}: capacity {name!r}: default exceeds the capacity")


def validate_device(device: Device, where: str = "") -> None:
    """Check one device against the v1 limits the schema misses; raise ValidationError."""
    where = f"{where}device {device.name!r}" if where else f"device {device.name!r}"
    _check_label(device.name, "device name")
    entries = len(device.attributes) + len(device.capacity)
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ValidationError(
            f"{where}: {entries} attributes and capacities, at most "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES} are allowed"
        )
    values = 0
    for key, value in device.attributes.items():
        check_qualified_name(key, f"{where} attribute")
        values += _check_value(value, f"{where} attribute {key!r}")
    if values > MAX_ATTRIBUTE_VALUES:
        raise ValidationError(
            f"{where}: {values} attribute values, at most {MAX_ATTRIBUTE_VALUES} are allowed"
        )
    for key, cap in device.capacity.items():
        check_qualified_name(key, f"{where} capacity")
        _check_capacity(key, cap, device, where)
    if len(device.taints) > MAX_TAINTS:
        raise ValidationError(f"{where}: {len(device.taints)} taints, at most {MAX_TAINTS}")
    for taint in device.taints:
        if not _is_label_key(taint.key):
            raise ValidationError(f"{where}: taint key {taint.key!r} is not a valid label key")
        if taint.value and (
            len(taint.value) > MAX_LABEL_LENGTH or not _LABEL_NAME.fullmatch(taint.value)
        ):
            raise ValidationError(
                f"{where}: taint value {taint.value!r} is not a valid label value"
            )
        if taint.effect not in TAINT_EFFECTS:
            raise ValidationError(
                f"{where}: taint effect {taint.effect!r} must be one of "
                f"{', '.join(sorted(TAINT_EFFECTS))}"
            )
    if len(device.consumes_counters) > MAX_CONSUMES_COUNTERS:
        raise ValidationError(
            f"{where}: consumes {len(device.consumes_counters)} counter sets, at most "
            f"{MAX_CONSUMES_COUNTERS}"
        )
    for consumption in device.consumes_counters:
        if len(consumption.counters) > MAX_COUNTERS_PER_SET:
            raise ValidationError(f"{where}: more than {MAX_COUNTERS_PER_SET} counters in a set")


def _is_label_key(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and (len(prefix) > MAX_OBJECT_NAME_LENGTH or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= MAX_LABEL_LENGTH and _LABEL_NAME.fullmatch(name) is not None


def validate_slice(resource_slice: ResourceSlice) -> None:
    """Check one ResourceSlice against the v1 limits the OpenAPI schema does not enforce.

    Raises :class:`~driver.errors.ValidationError` naming the slice, the device and the field.
    Reusable by anything that accepts slices (the API emulator, the controller's cache).
    """
    s = resource_slice
    where = f"ResourceSlice {s.name or s.generate_name or '<unnamed>'!r}: "
    if s.name:
        _check_subdomain(s.name, f"{where}name", MAX_OBJECT_NAME_LENGTH)
    _check_subdomain(s.driver, f"{where}driver", MAX_DRIVER_NAME_LENGTH)
    pool = s.pool.name
    if (
        not pool
        or len(pool) > MAX_POOL_NAME_LENGTH
        or not all(_DNS_SUBDOMAIN.fullmatch(part) for part in pool.split("/"))
    ):
        raise ValidationError(
            f"{where}pool name {pool!r} must be DNS subdomains separated by '/', at most "
            f"{MAX_POOL_NAME_LENGTH} characters"
        )
    if s.pool.generation < 0:
        raise ValidationError(f"{where}pool generation must be >= 0")
    if s.pool.resource_slice_count <= 0:
        raise ValidationError(f"{where}pool resourceSliceCount must be > 0")
    selections = sum(
        (
            s.node_name is not None,
            s.node_selector is not None,
            s.all_nodes,
            s.per_device_node_selection,
        )
    )
    if selections != 1:
        raise ValidationError(
            f"{where}exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
            f"must be set ({selections} are)"
        )
    if s.node_name is not None:
        _check_subdomain(s.node_name, f"{where}nodeName", MAX_OBJECT_NAME_LENGTH)
    _check_single_term(s.node_selector, f"{where}nodeSelector")
    if s.devices and s.shared_counters:
        raise ValidationError(f"{where}a slice holds devices or sharedCounters, never both")
    if len(s.shared_counters) > MAX_SHARED_COUNTER_SETS:
        raise ValidationError(f"{where}at most {MAX_SHARED_COUNTER_SETS} sharedCounters sets")
    limit = (
        MAX_DEVICES_PER_SLICE_ADVANCED
        if any(d.uses_advanced_features for d in s.devices)
        else MAX_DEVICES_PER_SLICE
    )
    if len(s.devices) > limit:
        raise ValidationError(
            f"{where}{len(s.devices)} devices, at most {limit} are allowed"
            + (" when a device uses taints, counters or list attributes" if limit < 128 else "")
        )
    seen: set[str] = set()
    for device in s.devices:
        if device.name in seen:
            raise ValidationError(f"{where}device name {device.name!r} is used twice")
        seen.add(device.name)
        validate_device(device, where)
        per_device = sum(
            (device.node_name is not None, device.node_selector is not None, device.all_nodes)
        )
        _check_single_term(device.node_selector, f"{where}device {device.name!r} nodeSelector")
        if s.per_device_node_selection and per_device != 1:
            raise ValidationError(
                f"{where}device {device.name!r} must set exactly one of nodeName, nodeSelector, "
                "allNodes (the slice uses perDeviceNodeSelection)"
            )
        if not s.per_device_node_selection and per_device:
            raise ValidationError(
                f"{where}device {device.name!r} selects nodes but the slice does not set "
                "perDeviceNodeSelection"
            )


def _check_single_term(selector: Mapping[str, object] | None, where: str) -> None:
    """A slice's or device's nodeSelector must have exactly one term (API validation)."""
    if selector is None:
        return
    terms = selector.get("nodeSelectorTerms")
    if not isinstance(terms, list) or len(terms) != 1:
        count = len(terms) if isinstance(terms, list) else 0
        raise ValidationError(f"{where} must have exactly one nodeSelectorTerm ({count} given)")


def validate_pool(slices: Sequence[ResourceSlice]) -> None:
    """Check every slice and the pool as a whole: same driver, pool and generation, unique
    device names across slices, and ``resourceSliceCount`` equal to the number of slices."""
    if not slices:
        raise ValidationError("a pool needs at least one ResourceSlice")
    first = slices[0]
    names: set[str] = set()
    for s in slices:
        validate_slice(s)
        if (s.driver, s.pool) != (first.driver, first.pool):
            raise ValidationError(
                f"ResourceSlice {s.name!r}: driver, pool name, generation and resourceSliceCount "
                f"must match the pool's other slices ({first.name!r})"
            )
        for device in s.devices:
            if device.name in names:
                raise ValidationError(
                    f"pool {s.pool.name!r}: device name {device.name!r} appears in two slices"
                )
            names.add(device.name)
    if first.pool.resource_slice_count != len(slices):
        raise ValidationError(
            f"pool {first.pool.name!r}: resourceSliceCount is {first.pool.resource_slice_count} "
            f"but {len(slices)} slices were given"
        )
    slice_names = [s.name for s in slices if s.name]
    if len(set(slice_names)) != len(slice_names):
        raise ValidationError(f"pool {first.pool.name!r}: two slices share a name")
