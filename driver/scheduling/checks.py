"""Input checks a pod gets before any node is tried, where the API server checks nothing.

The decision engine calls :func:`check_pod_input` once per pod, after parsing its legacy
resources and dialect annotations. It raises :class:`~driver.api.errors.ManifestError` naming
the claim, request and field, so the pod gets one specific message (event and condition in the
controller, ``unschedulable`` in ``biaxial simulate``) instead of a misleading "does not fit":

* dialect hints no GPU of the cluster can satisfy
  (:func:`driver.scheduling.dialects.check_against_cluster`);
* a request's DeviceClass that does not exist, with the class the user probably meant (another
  driver's class name such as ``gpu.nvidia.com``, or a near miss), or, for a passthrough class
  (``vfio``), that biaxial does not offer passthrough;
* Volcano's deprecated GPU-share resources (``volcano.sh/gpu-memory``, ``gpu-number``) where no
  node's device plugin serves them, with the ``vgpu-*`` resources to write instead
  (:func:`check_deprecated`);
* ``capacity.requests``: a negative amount (upstream's allocator refuses it too), a capacity
  name no device of the class has (``GPU devices have no capacity 'compute' (they have
  cores, memory)``), and an amount below the smallest share every such device allows (a
  request policy's ``validRange.min`` or smallest valid value), which upstream would silently
  round up (``memory: "6"`` is six bytes, not 6 GiB). Requests of allocated claims are state
  and not checked;
* another DRA driver's vocabulary where that driver publishes no device in the cluster: an
  opaque config entry for it (which no driver would read), a request selector naming its
  attribute domain (which fails on every device), with biaxial's equivalent named.

Once no node fits a pod and some node "cannot allocate all claims", :func:`unserved` adds the
request whose DeviceClass selects no device in the cluster at all (``nvidia.com/mig-3g.20gb``
where no GPU has that partition), so the message names the request, class and missing device.

Cluster facts (the GPU inventory, the drivers that publish devices, the capacities each class
can reach) come from the decision engine, which keeps them with its capacity index (device
kinds and their counts; each slice's inventory read once per slice object). Pure otherwise;
inputs are never mutated.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from driver.api.claims import (
    DeviceClass,
    DeviceRequest,
    ExactRequest,
    ResourceClaim,
    SubRequest,
)
from driver.api.errors import BiaxialError, ManifestError
from driver.api.model import Device, ResourceSlice
from driver.api.quantity import Quantity
from driver.cel.engine import Selector, compile_selector
from driver.scheduling.bridge import ExtendedResourceMap, PodLegacyResources
from driver.scheduling.capacity_index import DeviceKind
from driver.scheduling.classification import KindFacts
from driver.scheduling.dialects import GpuInventory, check_against_cluster
from driver.structured.snapshot import CapacitySpec

MIB: Final = 1024 * 1024
_PASSTHROUGH: Final = re.compile(r"vfio|passthrough", re.IGNORECASE)
#: Other DRA drivers users migrate from: driver name -> (who, biaxial's equivalent words).
FOREIGN_DRIVERS: Final[Mapping[str, tuple[str, str]]] = {
    "gpu.nvidia.com": (
        "the NVIDIA DRA driver",
        (
            "biaxial's driver is gpu.biaxial.dev, with the same attribute names (productName, "
            "uuid, index, ...); its GpuConfig (gpu.biaxial.dev/v1alpha1) takes "
            "sharing.strategy none (for TimeSlicing), mps (for MPS) or hami-core"
        ),
    ),
    "gpu.example.com": (
        "the DRA example driver",
        (
            "biaxial's driver is gpu.biaxial.dev; its GPUs have the capacities memory and "
            "cores (there is no compute), and its GpuConfig (gpu.biaxial.dev/v1alpha1) takes "
            "sharing.strategy none (for TimeSlicing), mps or hami-core"
        ),
    ),
}
#: Volcano's GPU-share resources, deprecated since Volcano 1.9 for its vGPU resources: where
#: no node advertises them (Volcano's old device plugin), what to write instead.
DEPRECATED_VOLCANO: Final[Mapping[str, tuple[str, str]]] = {
    "volcano.sh/gpu-memory": (
        "MiB of one shared GPU",
        "volcano.sh/vgpu-number: 1 with volcano.sh/vgpu-memory: <MiB>",
    ),
    "volcano.sh/gpu-number": ("whole GPUs", "volcano.sh/vgpu-number: <GPUs>"),
}
_MIG_RESOURCE: Final = re.compile(r"nvidia\.com/mig-(.+)")
#: Other drivers' DeviceClass names: (their driver, biaxial's class for the same devices).
FOREIGN_CLASSES: Final[Mapping[str, tuple[str, str]]] = {
    "gpu.nvidia.com": ("gpu.nvidia.com", "gpu.biaxial.dev"),
    "mig.nvidia.com": ("gpu.nvidia.com", "mig.biaxial.dev"),
    "gpu.example.com": ("gpu.example.com", "gpu.biaxial.dev"),
}


@dataclass(frozen=True, slots=True)
class ClassCapacities:
    """What the devices a class selects offer: capacity names, the smallest share of each
    that every such device allows, and what the devices are (for messages)."""

    names: frozenset[str]
    minimum: Mapping[str, Quantity]
    noun: str
    devices: int


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What the checks know of the cluster: biaxial's driver, its GPU inventory, the drivers
    that publish devices, and per DeviceClass what its devices offer.

    The GPU inventory (:attr:`gpus`) is read from ``slices`` when first asked for: only pods
    with GPU hints (UUIDs, types, MIG mode) need it, and reading every slice of a large
    cluster costs tens of milliseconds."""

    driver: str
    slices: Sequence[ResourceSlice]
    drivers: frozenset[str]
    classes: Mapping[str, ClassCapacities | None]
    _gpus: list[GpuInventory] = field(default_factory=list, compare=False, repr=False)

    @property
    def gpus(self) -> GpuInventory:
        """The GPUs of :attr:`driver` the slices publish."""
        if not self._gpus:
            self._gpus.append(gpu_inventory(self.slices, self.driver))
        return self._gpus[0]


@dataclass(frozen=True, slots=True)
class _SliceInventory:
    """One slice's share of the GPU inventory (kept per slice object: only changed slices
    are read again)."""

    held: ResourceSlice
    uuids: frozenset[str]
    products: frozenset[str]
    parents: frozenset[str]


_inventories: dict[int, _SliceInventory] = {}


def _slice_inventory(s: ResourceSlice) -> _SliceInventory:
    found = _inventories.get(id(s))
    if found is not None and found.held is s:
        return found
    uuids: set[str] = set()
    products: set[str] = set()
    parents: set[str] = set()
    for device in s.devices:
        attributes = device.attributes
        product = attributes.get("productName")
        if isinstance(product, str):
            products.add(product)
        if attributes.get("type") == "mig":
            parent = attributes.get("parentUUID")
            if isinstance(parent, str):
                parents.add(parent)
        else:
            uuid = attributes.get("uuid")
            if isinstance(uuid, str):
                uuids.add(uuid)
    found = _SliceInventory(s, frozenset(uuids), frozenset(products), frozenset(parents))
    _inventories[id(s)] = found
    return found


def gpu_inventory(slices: Sequence[ResourceSlice], driver: str) -> GpuInventory:
    """The GPUs of ``driver`` the slices publish (each slice read once per object)."""
    current = [_slice_inventory(s) for s in slices if s.driver == driver]
    if len(_inventories) > 2 * len(slices) + 64:  # forget slices that are gone
        keep = {id(part.held) for part in current}
        for key in [k for k in _inventories if k not in keep]:
            del _inventories[key]
    return GpuInventory(
        uuids=frozenset().union(*(part.uuids for part in current)),
        product_names=frozenset().union(*(part.products for part in current)),
        mig_parents=frozenset().union(*(part.parents for part in current)),
    )


def _minimum(spec: CapacitySpec) -> Quantity:
    """The smallest share a capacity's request policy allows (0 without a policy)."""
    if spec.range_min is not None:
        return Quantity(spec.range_min, spec.range_min_fmt)
    if spec.valid_values:
        low = min(range(len(spec.valid_values)), key=lambda i: spec.valid_values[i])
        return Quantity(spec.valid_values[low], spec.valid_value_fmts[low])
    return Quantity.from_int(0)


def class_capacities(
    device_class: DeviceClass,
    kinds: Mapping[DeviceKind, int],
    facts: Mapping[DeviceKind, KindFacts],
    elsewhere: Sequence[ResourceSlice] = (),
) -> ClassCapacities | None:
    """The capacities of the devices ``device_class`` selects (None when it selects none):
    from the capacity index's device kinds (``kinds``: device counts; a class selects a kind
    exactly, a CEL error counting as selecting), plus ``elsewhere``, the slices that are not
    node-local, whose devices are evaluated one by one."""
    names: set[str] = set()
    minimum: dict[str, Quantity] = {}
    types: set[object] = set()
    count = 0

    def offer(capacity: Iterable[tuple[str, Quantity]], kind_name: object, devices: int) -> None:
        nonlocal count
        count += devices
        types.add(kind_name)
        for name, low in capacity:
            names.add(name)
            minimum[name] = min(minimum.get(name, low), low)

    for kind, devices in kinds.items():
        if device_class.name in kind.classes:
            offer(
                ((spec.name, _minimum(spec)) for spec in kind.capacities),
                facts[kind].device.attributes.get("type"),
                devices,
            )
    if elsewhere:
        try:
            selectors = [compile_selector(e) for e in device_class.selectors]
        except BiaxialError:
            selectors = []
        for s in elsewhere:
            for device in s.devices:
                if selectors and _selected(selectors, s, device):
                    offer(
                        (
                            (name, _policy_minimum(device, name) or Quantity.from_int(0))
                            for name in device.capacity
                        ),
                        device.attributes.get("type"),
                        1,
                    )
    if not count:
        return None
    noun = {"gpu": "GPU devices", "mig": "MIG devices"}.get(
        str(next(iter(types))) if len(types) == 1 else "",
        f"devices of class {device_class.name}",
    )
    return ClassCapacities(names=frozenset(names), minimum=minimum, noun=noun, devices=count)


def _policy_minimum(device: Device, name: str) -> Quantity | None:
    capacity = device.capacity.get(name)
    if capacity is None or capacity.request_policy is None:
        return None
    policy = capacity.request_policy
    if policy.valid_range is not None:
        return policy.valid_range.min
    return min(policy.valid_values) if policy.valid_values else None


def _selected(selectors: Sequence[Selector], s: ResourceSlice, device: Device) -> bool:
    for selector in selectors:
        try:
            ok = selector.matches(device, s.driver)
        except BiaxialError:
            return True  # counts as selecting, as for the kinds: the allocator reports it
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------- the checks


def _class_hint(name: str, classes: Iterable[str]) -> str:
    if _PASSTHROUGH.search(name):
        return (
            f"; {name} asks for GPU passthrough (vfio-pci, whole GPUs handed to virtual "
            "machines), which biaxial does not offer: its devices are GPUs and MIG partitions "
            "for containers"
        )
    if name in FOREIGN_CLASSES:
        driver, ours = FOREIGN_CLASSES[name]
        return f" ({name} is {FOREIGN_DRIVERS[driver][0]}'s class; biaxial's is {ours})"
    guess = difflib.get_close_matches(name, sorted(classes), n=1, cutoff=0.8)
    return f"; did you mean {guess[0]}?" if guess else ""


def _bare(name: str, driver: str) -> str:
    domain, sep, rest = name.rpartition("/")
    return rest if sep and domain == driver else name


def _check_capacity(
    where: str,
    alt: ExactRequest | SubRequest,
    device_class: DeviceClass,
    facts: ClusterFacts,
) -> None:
    requests = alt.capacity_requests
    for name, amount in requests.items():
        if amount.sign() < 0:
            raise ManifestError(f"{where}: capacity.requests[{name!r}]: {amount} is negative")
    if not requests:
        return
    offered = facts.classes.get(device_class.name)
    if offered is None:
        return  # no device of the class at all: the decision says so
    for name, amount in sorted(requests.items()):
        bare = _bare(name, facts.driver)
        if bare not in offered.names:
            have = ", ".join(sorted(offered.names)) or "none"
            raise ManifestError(
                f"{where}: {offered.noun} have no capacity {name!r} (they have {have})"
            )
        low = offered.minimum.get(bare)
        if low is not None and amount < low:
            hint = ""
            if bare == "memory" and amount.sign() > 0 and str(amount).isdigit():
                hint = f" (memory is in bytes: did you mean {amount}Mi or {amount}Gi?)"
            raise ManifestError(
                f"{where}: capacity.requests[{name!r}]: {amount} is below the smallest share "
                f"the devices allow ({low}){hint}"
            )


def _selects_none(request: DeviceRequest, facts: ClusterFacts) -> str | None:
    """What to say of a request none of whose DeviceClasses selects a device in the cluster
    (an exact count only: allocation mode All is satisfied by no device at all)."""
    choices = [alt for _, alt in request.choices()]
    if any(alt.allocation_mode != "ExactCount" for alt in choices):
        return None
    names = sorted({alt.device_class_name for alt in choices})
    if any(n not in facts.classes or facts.classes[n] is not None for n in names):
        return None
    if len(names) == 1:
        return f"the selectors of DeviceClass {names[0]!r} match no device in the cluster"
    return f"the selectors of its DeviceClasses ({', '.join(names)}) match no device in the cluster"


_QUOTED: Final = re.compile(r"""["']([a-z0-9.-]+\.[a-z]+)["']""")


def _check_foreign(where: str, expressions: Iterable[str], facts: ClusterFacts) -> None:
    for expression in expressions:
        for domain in _QUOTED.findall(expression):
            if domain in FOREIGN_DRIVERS and domain not in facts.drivers:
                who, instead = FOREIGN_DRIVERS[domain]
                raise ManifestError(
                    f"{where}: the selector names {domain}, {who}, which publishes no device "
                    f"in this cluster; {instead}"
                )


def check_claim(
    claim: ResourceClaim,
    classes: Mapping[str, DeviceClass],
    facts: ClusterFacts,
) -> None:
    """Raise ManifestError for what no node can honour in a claim still to be allocated."""
    if claim.allocation is not None:
        return
    for request in claim.requests:
        for name, alt in request.choices():
            where = f"claim {claim.key}: request {name!r}"
            device_class = classes.get(alt.device_class_name)
            if device_class is None:
                raise ManifestError(
                    f"{where}: DeviceClass {alt.device_class_name!r} does not exist"
                    + _class_hint(alt.device_class_name, classes)
                )
            _check_foreign(where, alt.selectors, facts)
            _check_capacity(where, alt, device_class, facts)
    for index, entry in enumerate(claim.config):
        driver = entry.opaque.driver
        if driver == facts.driver or driver in facts.drivers:
            continue
        who, instead = FOREIGN_DRIVERS.get(driver, (f"driver {driver}", ""))
        raise ManifestError(
            f"claim {claim.key}: spec.devices.config[{index}]: configuration for {who}, which "
            f"publishes no device in this cluster, so nothing would read it"
            + (f"; {instead}" if instead else "")
        )


def check_deprecated(
    legacy: PodLegacyResources, requests: Mapping[str, int], advertised: Collection[str]
) -> None:
    """Refuse Volcano's deprecated GPU-share resources where no node advertises them (in
    ``advertised``: some node's device plugin serves them, and NodeResourcesFit decides)."""
    for name, (meaning, instead) in DEPRECATED_VOLCANO.items():
        if requests.get(name, 0) > 0 and name not in advertised:
            raise ManifestError(
                f"pod {legacy.pod_name}: {name} ({meaning}) is Volcano's GPU-share resource, "
                f"deprecated since Volcano 1.9 and served by no node here; write {instead}"
            )


def unserved(
    claims: Sequence[ResourceClaim],
    legacy: PodLegacyResources,
    resource_map: ExtendedResourceMap,
    facts: ClusterFacts,
    advertised: Collection[str],
) -> str | None:
    """Why no node can allocate the pod's claims, when the reason is that a request's
    DeviceClass selects no device in the whole cluster (a claim's request, or a bridge
    request whose resource no node's device plugin serves either: ``nvidia.com/mig-3g.20gb``
    where no GPU has such a partition); None otherwise. Asked only once no node fits, to add
    to the "cannot allocate all claims" count the request, class and missing device."""
    for claim in claims:
        if claim.allocation is not None:
            continue
        for request in claim.requests:
            found = _selects_none(request, facts)
            if found is not None:
                return f"claim {claim.key}: request {request.name!r}: {found}"
    for legacy_request in legacy.requests:
        name = legacy_request.device_class or resource_map.class_for(legacy_request.resource)
        if name is None or name not in facts.classes or facts.classes[name] is not None:
            continue
        if legacy_request.resource in advertised:
            continue
        mig = _MIG_RESOURCE.fullmatch(legacy_request.resource)
        what = f"no node has a MIG {mig.group(1)} partition; " if mig else ""
        return (
            f"pod {legacy.pod_name} container {legacy_request.container_name}: "
            f"{legacy_request.resource}: "
            f"{legacy_request.count}: {what}the selectors of DeviceClass {name!r} match no "
            "device in the cluster"
        )
    return None


def check_pod_input(
    claims: Sequence[ResourceClaim],
    legacy: PodLegacyResources,
    classes: Mapping[str, DeviceClass],
    facts: ClusterFacts,
) -> None:
    """Every check of this module for one pod (see the module docstring) but
    :func:`check_deprecated`, which needs the nodes' allocatable, and :func:`unserved`."""
    if legacy.hints.reads_inventory:  # (reading it costs: ClusterFacts)
        check_against_cluster(legacy.hints, facts.gpus)
    for claim in claims:
        check_claim(claim, classes, facts)


def cluster_facts(
    slices: Sequence[ResourceSlice],
    classes: Mapping[str, DeviceClass],
    driver: str,
    kinds: Mapping[DeviceKind, int],
    facts: Mapping[DeviceKind, KindFacts],
) -> ClusterFacts:
    """The facts for one state of the cluster (the engine keeps them until its slices or
    device kinds change)."""
    elsewhere = [s for s in slices if not s.node_name]
    return ClusterFacts(
        driver=driver,
        slices=slices,
        drivers=frozenset(s.driver for s in slices if s.devices),
        classes={
            name: class_capacities(device_class, kinds, facts, elsewhere)
            for name, device_class in classes.items()
        },
    )
