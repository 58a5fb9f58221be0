"""Input checks a pod gets before any node is tried, where the API server checks nothing.

The decision engine calls :func:`check_pod_input` once per pod, after parsing its legacy
resources and dialect annotations. It raises :class:`~driver.api.errors.ManifestError` naming
the claim, request and field, so the pod gets one specific message (event and condition in the
controller, ``unschedulable`` in ``biaxial simulate``) instead of a misleading "does not fit":

* dialect hints no GPU of the cluster can satisfy
  (:func:`driver.scheduling.dialects.check_against_cluster`);
* a request's DeviceClass that does not exist, with the class the user probably meant (another
  driver's class name such as ``gpu.nvidia.com``, or a near miss);
* ``capacity.requests``: a negative amount (upstream's allocator refuses it too), a capacity
  name no device of the class has (``GPU devices have no capacity 'compute' (they have
  cores, memory)``), and an amount below the smallest share every such device allows (a
  request policy's ``validRange.min`` or smallest valid value), which upstream would silently
  round up (``memory: "6"`` is six bytes, not 6 GiB). Requests of allocated claims are state
  and not checked;
* another DRA driver's vocabulary where that driver publishes no device in the cluster: an
  opaque config entry for it (which no driver would read), a request selector naming its
  attribute domain (which fails on every device), with biaxial's equivalent named.

Cluster facts (the GPU inventory, the drivers that publish devices, the capacities each class
can reach) are computed once per set of slices and cached. Pure otherwise; inputs are never
mutated.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from driver.api.claims import DeviceClass, ExactRequest, ResourceClaim, SubRequest
from driver.api.errors import BiaxialError, ManifestError
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.api.model import Device, ResourceSlice
from driver.api.quantity import Quantity
from driver.cel.engine import MatchCache, Selector, compile_selector
from driver.scheduling.bridge import PodLegacyResources
from driver.scheduling.dialects import GpuInventory, check_against_cluster
from driver.structured.snapshot import ClusterSnapshot

MIB: Final = 1024 * 1024
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
#: Other drivers' DeviceClass names: (their driver, biaxial's class for the same devices).
FOREIGN_CLASSES: Final[Mapping[str, tuple[str, str]]] = {
    "gpu.nvidia.com": ("gpu.nvidia.com", "gpu.biaxial.dev"),
    "mig.nvidia.com": ("gpu.nvidia.com", "mig.biaxial.dev"),
    "gpu.example.com": ("gpu.example.com", "gpu.biaxial.dev"),
}
_FACT_CACHE_SIZE: Final = 4


@dataclass(frozen=True, slots=True)
class ClassCapacities:
    """What the devices a class selects offer: capacity names, the smallest share of each
    that every such device allows, and what the devices are (for messages)."""

    names: frozenset[str]
    minimum: Mapping[str, Quantity]
    noun: str
    devices: int


@dataclass(slots=True)
class ClusterFacts:
    """Per set of slices: the GPU inventory, the drivers with devices, class capacities."""

    slices: tuple[ResourceSlice, ...]
    driver: str
    gpus: GpuInventory
    drivers: frozenset[str]
    classes: dict[str, ClassCapacities | None] = field(default_factory=dict)


_facts: list[ClusterFacts] = []


def cluster_facts(snapshot: ClusterSnapshot, driver: str) -> ClusterFacts:
    """The facts for the snapshot's slices (cached by the identity of the slice tuple, which
    every snapshot derived with new allocations shares)."""
    slices = snapshot.slices
    for facts in _facts:
        if facts.slices is slices and facts.driver == driver:
            return facts
    uuids: set[str] = set()
    products: set[str] = set()
    parents: set[str] = set()
    for s in slices:
        if s.driver != driver:
            continue
        for device in s.devices:
            attributes = device.attributes
            kind = attributes.get("type")
            product = attributes.get("productName")
            if isinstance(product, str):
                products.add(product)
            if kind == "mig":
                parent = attributes.get("parentUUID")
                if isinstance(parent, str):
                    parents.add(parent)
            else:
                uuid = attributes.get("uuid")
                if isinstance(uuid, str):
                    uuids.add(uuid)
    facts = ClusterFacts(
        slices=slices,
        driver=driver,
        gpus=GpuInventory(
            uuids=frozenset(uuids),
            product_names=frozenset(products),
            mig_parents=frozenset(parents),
        ),
        drivers=frozenset(s.driver for s in slices if s.devices),
    )
    _facts.insert(0, facts)
    del _facts[_FACT_CACHE_SIZE:]
    return facts


def _policy_minimum(device: Device, name: str) -> Quantity | None:
    capacity = device.capacity.get(name)
    if capacity is None or capacity.request_policy is None:
        return None
    policy = capacity.request_policy
    if policy.valid_range is not None:
        return policy.valid_range.min
    return min(policy.valid_values) if policy.valid_values else None


#: Attributes that tell devices of one kind apart; a class that does not name them selects
#: all devices of a kind alike, so one of each kind is evaluated.
_IDENTITY_ATTRIBUTES: Final = (
    "uuid",
    "parentUUID",
    "index",
    "minor",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/numaNode",
)


def _kind_key(driver: str, device: Device, identity: tuple[str, ...]) -> tuple[object, ...]:
    attributes = device.attributes
    return (
        driver,
        tuple(sorted((k, v) for k, v in attributes.items() if k not in identity)),
        tuple(sorted(device.capacity)),
        device.allow_multiple_allocations,
    )


def class_capacities(
    facts: ClusterFacts, device_class: DeviceClass, cache: MatchCache | None
) -> ClassCapacities | None:
    """The capacities of the devices ``device_class`` selects (None when it selects none or
    its selectors do not compile); cached per class. Devices that differ only in identity
    attributes are evaluated once, unless the class's selectors name one of them."""
    if device_class.name in facts.classes:
        return facts.classes[device_class.name]
    found: ClassCapacities | None = None
    try:
        selectors = [compile_selector(e) for e in device_class.selectors]
    except BiaxialError:
        selectors = None
    if selectors is not None:
        text = " ".join(device_class.selectors)
        identity = tuple(a for a in _IDENTITY_ATTRIBUTES if a.rpartition("/")[2] not in text)
        verdicts: dict[tuple[object, ...], bool] = {}
        names: set[str] = set()
        minimum: dict[str, Quantity] = {}
        kinds: set[object] = set()
        count = 0
        for s in facts.slices:
            for device in s.devices:
                key = _kind_key(s.driver, device, identity)
                selected = verdicts.get(key)
                if selected is None:
                    selected = _selected(selectors, s, device, cache)
                    verdicts[key] = selected
                if not selected:
                    continue
                count += 1
                kinds.add(device.attributes.get("type"))
                for name in device.capacity:
                    names.add(name)
                    low = _policy_minimum(device, name) or Quantity.from_int(0)
                    minimum[name] = min(minimum.get(name, low), low)
        if count:
            noun = {"gpu": "GPU devices", "mig": "MIG devices"}.get(
                str(next(iter(kinds))) if len(kinds) == 1 else "",
                f"devices of class {device_class.name}",
            )
            found = ClassCapacities(
                names=frozenset(names), minimum=minimum, noun=noun, devices=count
            )
    facts.classes[device_class.name] = found
    return found


def _selected(
    selectors: Sequence[Selector], s: ResourceSlice, device: Device, cache: MatchCache | None
) -> bool:
    device_id = DeviceID(DriverName(s.driver), PoolName(s.pool.name), DeviceName(device.name))
    for selector in selectors:
        try:
            if cache is not None:
                ok = cache.matches(selector, device_id, s.generation, device)
            else:
                ok = selector.matches(device, s.driver)
        except BiaxialError:
            return False
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------- the checks


def _class_hint(name: str, classes: Iterable[str]) -> str:
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
    cache: MatchCache | None,
) -> None:
    requests = alt.capacity_requests
    for name, amount in requests.items():
        if amount.sign() < 0:
            raise ManifestError(f"{where}: capacity.requests[{name!r}]: {amount} is negative")
    if not requests:
        return
    offered = class_capacities(facts, device_class, cache)
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
    cache: MatchCache | None = None,
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
            _check_capacity(where, alt, device_class, facts, cache)
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


def check_pod_input(
    claims: Sequence[ResourceClaim],
    legacy: PodLegacyResources,
    snapshot: ClusterSnapshot,
    driver: str,
) -> None:
    """Every check of this module for one pod (see the module docstring)."""
    facts = cluster_facts(snapshot, driver)
    check_against_cluster(legacy.hints, facts.gpus)
    for claim in claims:
        check_claim(claim, snapshot.classes, facts, snapshot.match_cache)
