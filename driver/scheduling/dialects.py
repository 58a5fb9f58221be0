"""Speaking the dialects: the pod annotations migrating users bring, each honoured or refused.

Users arrive with the vocabularies of HAMi, Volcano's vGPU scheduler and KAI Scheduler. Every
key of those vocabularies that a pod scheduled by biaxial carries is either turned into part
of the pod's bridge claim (KEP-5004, :mod:`driver.scheduling.bridge`), where
``kubectl get resourceclaim -o yaml`` shows it, or refused with a message that says why and
what to write instead. Nothing is dropped. The table (sources: HAMi
``pkg/device/nvidia/device.go`` and ``pkg/device/devices.go``, Volcano
``pkg/scheduler/api/devices/nvidia/vgpu/type.go`` and ``utils.go``, KAI Scheduler
``pkg/common/constants/constants.go`` and ``pkg/binder/plugins/gpusharing``):

=====================================  ===============================================
annotation                             biaxial
=====================================  ===============================================
``nvidia.com/use-gputype``             request selector: the GPU's HAMi type (its product
                                       name, ``NVIDIA-`` prepended unless it starts with
                                       ``NVIDIA``) contains one of the comma-separated
                                       items, case-insensitively (HAMi's ``CheckType``)
``nvidia.com/nouse-gputype``           request selector: contains none of them
``nvidia.com/use-gpuuuid``,            request selector: the GPU's UUID is (is not) one
``nvidia.com/nouse-gpuuuid``           of the comma-separated UUIDs (HAMi's ``CheckUUID``)
``volcano.sh/vgpu-use-gpuuuid``,       the same, in Volcano's words
``volcano.sh/vgpu-nouse-gpuuuid``
``nvidia.com/numa-bind``               ``true`` (Go ``strconv.ParseBool``): a
                                       ``matchAttribute`` constraint on
                                       ``resource.kubernetes.io/numaNode`` for each
                                       container request of two or more GPUs
``nvidia.com/vgpu-mode``,              ``hami-core`` / ``mps``: a ``GpuConfig`` with that
``volcano.sh/vgpu-mode``               sharing strategy on the requests; ``mig``: the
                                       requests become MIG devices (:func:`mig_selectors`)
``gpu-fraction``, ``gpu-memory``       KAI: a share of each GPU of the target container's
                                       ``nvidia.com/gpu`` request (fraction of its memory,
                                       or MiB)
``gpu-fraction-num-devices``           KAI: must equal that request's GPU count
``gpu-fraction-container-name``        KAI: the target container (default: the first)
``mps``                                KAI: ``"true"`` is the ``mps`` sharing strategy
``hami.io/node-scheduler-policy``,     read by :mod:`driver.scheduling.policy`
``hami.io/gpu-scheduler-policy``
``biaxial.dev/node-policy``,           read by :mod:`driver.scheduling.policy`
``biaxial.dev/gpu-policy``
``hami.io/device-scoring-weights``     refused: biaxial's scores are its own
``volcano.sh/vgpu-podgroup-policy``    refused: no GPU anti-affinity between pods yet
any other ``biaxial.dev/`` key         refused, with the nearest known key
a near miss of any key above           refused, with the key it resembles
=====================================  ===============================================

KAI hands a GPU to a container through its own binder; biaxial hands DRA devices to
containers through the kubelet, which gives a container the devices of a bridge-claim request
only when the container itself asks for the extended resource (kubelet ``GetResources``). So a
KAI pod keeps its annotations and its target container adds ``nvidia.com/gpu: <devices>``; a
target container without it is refused with exactly that advice.

Annotations HAMi, Volcano and KAI write on pods themselves (``hami.io/vgpu-node``,
``volcano.sh/vgpu-ids-new``, ``received-resource-type``, ...) are bookkeeping, not requests:
they are ignored, and never mistaken for near misses.

:func:`pod_hints` parses a pod's annotations (raising
:class:`~driver.api.errors.ManifestError`); :func:`check_against_cluster` checks what can only
be checked against the cluster's GPUs (a UUID no GPU has, a GPU type no GPU is, MIG without
MIG partitions). Pure; inputs are never mutated.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Literal

from driver.api.errors import ManifestError, quoted

SharingMode = Literal["hami-core", "mps", "mig"]

USE_GPUTYPE: Final = "nvidia.com/use-gputype"
NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
USE_GPUUUID: Final = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID: Final = "nvidia.com/nouse-gpuuuid"
NUMA_BIND: Final = "nvidia.com/numa-bind"
VGPU_MODE: Final = "nvidia.com/vgpu-mode"
VOLCANO_USE_GPUUUID: Final = "volcano.sh/vgpu-use-gpuuuid"
VOLCANO_NOUSE_GPUUUID: Final = "volcano.sh/vgpu-nouse-gpuuuid"
VOLCANO_VGPU_MODE: Final = "volcano.sh/vgpu-mode"
VOLCANO_PODGROUP_POLICY: Final = "volcano.sh/vgpu-podgroup-policy"
HAMI_SCORING_WEIGHTS: Final = "hami.io/device-scoring-weights"
KAI_FRACTION: Final = "gpu-fraction"
KAI_MEMORY: Final = "gpu-memory"
KAI_NUM_DEVICES: Final = "gpu-fraction-num-devices"
KAI_CONTAINER: Final = "gpu-fraction-container-name"
KAI_MPS: Final = "mps"
BIAXIAL_PREFIX: Final = "biaxial.dev/"
#: What the chart's admission step changed on the pod (:mod:`driver.scheduling.admission`).
ADMISSION_NOTE: Final = "biaxial.dev/admission"
BIAXIAL_KEYS: Final = frozenset({"biaxial.dev/node-policy", "biaxial.dev/gpu-policy"})
HAMI_POLICY_KEYS: Final = frozenset(
    {"hami.io/node-scheduler-policy", "hami.io/gpu-scheduler-policy"}
)
MODES: Final[tuple[SharingMode, ...]] = ("hami-core", "mps", "mig")
NUMA_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"

#: Every key a user may write that biaxial honours (the parsers here or in policy.py).
HONOURED: Final = frozenset(
    {
        USE_GPUTYPE,
        NOUSE_GPUTYPE,
        USE_GPUUUID,
        NOUSE_GPUUUID,
        NUMA_BIND,
        VGPU_MODE,
        VOLCANO_USE_GPUUUID,
        VOLCANO_NOUSE_GPUUUID,
        VOLCANO_VGPU_MODE,
        KAI_FRACTION,
        KAI_MEMORY,
        KAI_NUM_DEVICES,
        KAI_CONTAINER,
        KAI_MPS,
    }
    | BIAXIAL_KEYS
    | HAMI_POLICY_KEYS
)
#: Keys of the vocabularies biaxial cannot honour, with the reason given to the user.
REFUSED: Final[Mapping[str, str]] = {
    HAMI_SCORING_WEIGHTS: (
        "HAMi's per-pod scoring weights are not supported: biaxial scores nodes and GPUs with "
        "the formulas in docs/scoring.md; choose binpack or spread with biaxial.dev/node-policy "
        "and biaxial.dev/gpu-policy"
    ),
    VOLCANO_PODGROUP_POLICY: (
        "Volcano's pod-group GPU spread (no two pods of a group on one GPU) is not supported; "
        "biaxial.dev/gpu-policy: spread prefers idle GPUs but does not forbid sharing"
    ),
}
#: Annotations the other schedulers write on pods for their own bookkeeping: not requests.
BOOKKEEPING: Final = frozenset(
    {
        ADMISSION_NOTE,
        "hami.io/vgpu-node",
        "hami.io/vgpu-time",
        "hami.io/bind-phase",
        "hami.io/bind-time",
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-mig-allocations",
        "volcano.sh/vgpu-ids-new",
        "volcano.sh/vgpu-node",
        "volcano.sh/vgpu-time",
        "volcano.sh/devices-to-allocate",
        "volcano.sh/bind-phase",
        "volcano.sh/bind-time",
        "volcano.sh/predicate-time",
        "volcano.sh/gpu-index",
        "received-resource-type",
        "pod-group-name",
    }
)
#: The resource names of the dialects (driver.scheduling.bridge reads them from
#: ``resources.limits``; Volcano's deprecated gpu-share names are refused there): written as
#: annotations, they are misplaced, not typos of an annotation.
RESOURCE_NAMES: Final = frozenset(
    {
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/vgpu-cores",
        "volcano.sh/gpu-memory",
        "volcano.sh/gpu-number",
    }
)
_MIG_RESOURCE: Final = re.compile(r"nvidia\.com/mig-[0-9]+g\.[0-9]+gb")
_QUOTED_VALUE: Final = 20
_NEAR_MISS_DOMAINS: Final = ("nvidia.com/", "hami.io/", "volcano.sh/", BIAXIAL_PREFIX)
_NEAR_MISS_CUTOFF: Final = 0.85
_BOOL_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_BOOL_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_UNSIGNED: Final = re.compile(r"[0-9]+")


# --------------------------------------------------------------------------- parsed hints


@dataclass(frozen=True, slots=True)
class KaiShare:
    """KAI's fractional request: a share of each GPU of one container's GPU request."""

    container: str
    memory_mib: int | None = None
    memory_fraction: Fraction | None = None
    devices: int | None = None  # gpu-fraction-num-devices, when given
    keys: tuple[str, ...] = ()  # the annotations that made it, for messages


@dataclass(frozen=True, slots=True)
class PodHints:
    """What a pod's dialect annotations ask of its GPU requests (see the module table)."""

    use_types: tuple[str, ...] = ()
    avoid_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    avoid_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    mode: SharingMode | None = None
    kai: KaiShare | None = None
    keys: Mapping[str, str] | None = None  # every honoured device key given -> its value

    @property
    def strategy(self) -> Literal["hami-core", "mps"] | None:
        """The sharing strategy asked for (``mig`` is a device kind, not a strategy)."""
        if self.mode in {"hami-core", "mps"}:
            return self.mode
        return None

    @property
    def reads_inventory(self) -> bool:
        """Whether :func:`check_against_cluster` reads the cluster's GPU inventory for these
        hints (MIG mode, or an allow-list of UUIDs or types); without, it refuses nothing."""
        return self.mode == "mig" or bool(self.use_uuids) or bool(self.use_types)

    @property
    def device_keys(self) -> tuple[str, ...]:
        """The annotations that shape the GPU requests (sorted), for messages."""
        return tuple(sorted(self.keys or ()))

    def selectors(self) -> tuple[str, ...]:
        """CEL request selectors for every GPU request (``mig`` matches the parent GPU)."""
        uuid = "parentUUID" if self.mode == "mig" else "uuid"
        out: list[str] = []
        if self.use_types:
            out.append(_type_selector(self.use_types))
        if self.avoid_types:
            out.append(f"!({_type_selector(self.avoid_types)})")
        if self.use_uuids:
            out.append(f"device.attributes[device.driver].{uuid} in {_cel_list(self.use_uuids)}")
        if self.avoid_uuids:
            out.append(
                f"!(device.attributes[device.driver].{uuid} in {_cel_list(self.avoid_uuids)})"
            )
        return tuple(out)


def _cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def hami_type(product_name: str) -> str:
    """HAMi's card type for a GPU: the NVML product name, ``NVIDIA-`` prepended unless it
    already starts with ``NVIDIA`` (HAMi's device plugin ``register.go``)."""
    return product_name if product_name.startswith("NVIDIA") else f"NVIDIA-{product_name}"


def type_matches(product_name: str, items: Iterable[str]) -> bool:
    """HAMi's ``CheckType`` for one list: an item is a case-insensitive substring."""
    card = hami_type(product_name).upper()
    return any(item.upper() in card for item in items)


def _type_selector(items: Sequence[str]) -> str:
    product = "device.attributes[device.driver].productName"
    card = f'(({product}.startsWith("NVIDIA") ? "" : "NVIDIA-") + {product}).upperAscii()'
    upper = [i.upper() for i in items]
    return f"{_cel_list(upper)}.exists(t, {card}.contains(t))"


def mig_selectors(memory_mib: int | None, cores: int | None) -> tuple[str, ...]:
    """The request selectors that make a GPU request a MIG partition with at least the
    memory (MiB) and cores (percent of the parent GPU) asked for.

    Existing partitions and dynamic-MIG placements alike match; among a request's fitting
    placements the GPU axis ranks the smallest profile first (``scoring.CounterGeometry``),
    so dynamic MIG creates the smallest profile that holds the memory.
    """
    out = []
    if memory_mib is not None:
        out.append(
            f'device.capacity[device.driver].memory.compareTo(quantity("{memory_mib}Mi")) >= 0'
        )
    if cores:
        out.append(f'device.capacity[device.driver].cores.compareTo(quantity("{cores}")) >= 0')
    return tuple(out)


# --------------------------------------------------------------------------- parsing


def _items(value: str) -> tuple[str, ...]:
    """A HAMi comma list: items trimmed, empty items skipped (an empty list = no constraint)."""
    return tuple(dict.fromkeys(i.strip() for i in value.split(",") if i.strip()))


def _mode(key: str, value: str) -> SharingMode:
    text = value.strip()
    for mode in MODES:
        if text == mode:
            return mode
    raise ManifestError(
        f"annotation {key}: unknown mode {quoted(value)} (allowed: {', '.join(MODES)})"
    )


def _bool(key: str, value: str) -> bool:
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise ManifestError(f"annotation {key}: {quoted(value)} is not a boolean (true or false)")


def near_miss(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` most resembles, if it is a plausible typo of it."""
    found = difflib.get_close_matches(key, sorted(known), n=1, cutoff=_NEAR_MISS_CUTOFF)
    return found[0] if found else None


def _check_unknown(key: str, value: str) -> None:
    """Refuse an unknown ``biaxial.dev/`` key, a resource name written as an annotation and a
    near miss of any vocabulary key."""
    if key in RESOURCE_NAMES or _MIG_RESOURCE.fullmatch(key):
        shown = value if len(value) <= _QUOTED_VALUE else value[:_QUOTED_VALUE] + "..."
        raise ManifestError(
            f"annotation {key}: a resource, not an annotation; write "
            f"{key}: {json.dumps(shown)} under the container's resources.limits"
        )
    if key in BOOKKEEPING:
        return
    vocabulary = HONOURED | REFUSED.keys()
    if key.startswith(BIAXIAL_PREFIX):
        guess = near_miss(key, vocabulary)
        hint = f"; did you mean {guess}?" if guess else ""
        raise ManifestError(
            f"annotation {key}: unknown biaxial.dev annotation{hint} "
            f"(biaxial reads {', '.join(sorted(BIAXIAL_KEYS))})"
        )
    if "/" in key and not key.startswith(_NEAR_MISS_DOMAINS):
        return
    guess = near_miss(key, vocabulary)
    if guess is not None:
        raise ManifestError(f"annotation {key}: not a key biaxial knows; did you mean {guess}?")


def _kai(annotations: Mapping[str, str], containers: Sequence[str]) -> KaiShare | None:
    keys = tuple(
        k for k in (KAI_FRACTION, KAI_MEMORY, KAI_NUM_DEVICES, KAI_CONTAINER) if k in annotations
    )
    fraction_raw = annotations.get(KAI_FRACTION)
    memory_raw = annotations.get(KAI_MEMORY)
    if fraction_raw is None and memory_raw is None:
        if keys:
            raise ManifestError(
                f"annotation {keys[0]}: given without {KAI_FRACTION} or {KAI_MEMORY} "
                "(KAI's companion annotations modify a fractional request)"
            )
        return None
    if fraction_raw is not None and memory_raw is not None:
        raise ManifestError(
            f"annotations {KAI_FRACTION} and {KAI_MEMORY}: give one or the other "
            "(a fraction of each GPU's memory, or MiB)"
        )
    fraction: Fraction | None = None
    memory: int | None = None
    if fraction_raw is not None:
        text = fraction_raw.strip()
        value = Fraction(text) if _DECIMAL.fullmatch(text) else None
        if value is None or not 0 < value < 1:
            raise ManifestError(
                f"annotation {KAI_FRACTION}: {quoted(fraction_raw)} must be a number greater "
                "than 0 and smaller than 1 (the share of one GPU's memory); use nvidia.com/gpu for "
                "whole GPUs"
            )
        fraction = value
    if memory_raw is not None:
        text = memory_raw.strip()
        if not _UNSIGNED.fullmatch(text) or int(text) == 0:
            raise ManifestError(
                f"annotation {KAI_MEMORY}: {quoted(memory_raw)} must be a positive whole number "
                "of MiB (e.g. 2000)"
            )
        memory = int(text)
    devices: int | None = None
    devices_raw = annotations.get(KAI_NUM_DEVICES)
    if devices_raw is not None:
        text = devices_raw.strip()
        if not _UNSIGNED.fullmatch(text) or int(text) == 0:
            raise ManifestError(
                f"annotation {KAI_NUM_DEVICES}: {quoted(devices_raw)} must be a positive "
                "whole number"
            )
        devices = int(text)
    target = annotations.get(KAI_CONTAINER)
    if target is None:
        if not containers:
            raise ManifestError(f"annotation {keys[0]}: the pod has no container")
        target = containers[0]
    elif target not in containers:
        raise ManifestError(
            f"annotation {KAI_CONTAINER}: no container named {quoted(target)} "
            f"(containers: {', '.join(containers) or 'none'})"
        )
    return KaiShare(
        container=target,
        memory_mib=memory,
        memory_fraction=fraction,
        devices=devices,
        keys=keys,
    )


def _container_names(pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    spec = pod.get("spec") or {}
    names: list[list[str]] = [[], []]
    for position, field in enumerate(("containers", "initContainers")):
        for container in spec.get(field) or ():
            if isinstance(container, Mapping) and isinstance(container.get("name"), str):
                names[position].append(container["name"])
    return names[0], names[1]


def pod_hints(pod: Mapping[str, Any]) -> PodHints:
    """Parse a pod's dialect annotations (see the module table); raise
    :class:`~driver.api.errors.ManifestError` naming the annotation for anything refused."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ManifestError("metadata.annotations must be an object")
    for key in sorted(annotations):
        value = annotations[key]
        if not isinstance(key, str) or not isinstance(value, str):
            raise ManifestError(f"annotation {key!r}: annotation values must be strings")
        if key in REFUSED:
            raise ManifestError(f"annotation {key}: {REFUSED[key]}")
        if key not in HONOURED:
            _check_unknown(key, value)
    modes = {
        k: _mode(k, annotations[k]) for k in (VGPU_MODE, VOLCANO_VGPU_MODE) if k in annotations
    }
    if len(set(modes.values())) > 1:
        raise ManifestError(
            f"annotations {VGPU_MODE} and {VOLCANO_VGPU_MODE} disagree "
            f"({quoted(modes[VGPU_MODE])} and {quoted(modes[VOLCANO_VGPU_MODE])}); give one"
        )
    mode = next(iter(modes.values()), None)
    mps = annotations.get(KAI_MPS)
    regular, init = _container_names(pod)
    kai = _kai(annotations, [*regular, *init] if KAI_CONTAINER in annotations else regular)
    kai_mps = mps is not None and _bool(KAI_MPS, mps)
    if kai_mps:
        if kai is None:
            raise ManifestError(
                f"annotation {KAI_MPS}: KAI's MPS switch needs {KAI_FRACTION} or "
                f"{KAI_MEMORY}; for whole GPUs use {VGPU_MODE}: mps"
            )
        if mode not in (None, "mps"):
            raise ManifestError(
                f"annotation {KAI_MPS}: 'true' asks for MPS, but the pod's vgpu-mode is "
                f"{quoted(mode)}"
            )
        mode = "mps"
    if kai is not None and mode == "mig":
        raise ManifestError(
            f"annotation {kai.keys[0]}: a KAI share cannot be a MIG partition "
            f"(vgpu-mode mig); give nvidia.com/gpumem with vgpu-mode mig instead"
        )
    use_uuids = _items(annotations.get(USE_GPUUUID, "")) + _items(
        annotations.get(VOLCANO_USE_GPUUUID, "")
    )
    avoid_uuids = _items(annotations.get(NOUSE_GPUUUID, "")) + _items(
        annotations.get(VOLCANO_NOUSE_GPUUUID, "")
    )
    numa = _bool(NUMA_BIND, annotations[NUMA_BIND]) if NUMA_BIND in annotations else False
    device_keys = {
        k: annotations[k]
        for k in (
            USE_GPUTYPE,
            NOUSE_GPUTYPE,
            USE_GPUUUID,
            NOUSE_GPUUUID,
            VOLCANO_USE_GPUUUID,
            VOLCANO_NOUSE_GPUUUID,
            NUMA_BIND,
            VGPU_MODE,
            VOLCANO_VGPU_MODE,
        )
        if k in annotations
    }
    if kai_mps and mps is not None:
        device_keys[KAI_MPS] = mps
    return PodHints(
        use_types=_items(annotations.get(USE_GPUTYPE, "")),
        avoid_types=_items(annotations.get(NOUSE_GPUTYPE, "")),
        use_uuids=tuple(dict.fromkeys(use_uuids)),
        avoid_uuids=tuple(dict.fromkeys(avoid_uuids)),
        numa_bind=numa,
        mode=mode,
        kai=kai,
        keys=device_keys or None,
    )


# --------------------------------------------------------------------------- the cluster


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """What the hint checks need to know about the cluster's GPUs (of biaxial's driver)."""

    uuids: frozenset[str] = frozenset()  # whole GPUs and MIG parents
    product_names: frozenset[str] = frozenset()
    mig_parents: frozenset[str] = frozenset()  # UUIDs of GPUs with MIG partitions

    @property
    def has_mig(self) -> bool:
        return bool(self.mig_parents)


def check_against_cluster(hints: PodHints, inventory: GpuInventory) -> None:
    """Refuse hints no GPU of the cluster can satisfy, naming the annotation: a ``use-gpuuuid``
    UUID no GPU has, a ``use-gputype`` list that matches no GPU, ``mig`` without MIG
    partitions. Deny-lists (``nouse-*``) never refuse: naming an absent GPU excludes nothing."""
    keys = hints.keys or {}
    if hints.mode == "mig" and not inventory.has_mig:
        key = VGPU_MODE if VGPU_MODE in keys else VOLCANO_VGPU_MODE
        raise ManifestError(
            f"annotation {key}: mig, but no GPU in the cluster has MIG partitions (biaxial "
            "allocates existing partitions; ask for a share with nvidia.com/gpumem instead)"
        )
    # Only an allow-list can name what is not there: a deny-list of an absent GPU excludes
    # nothing, and HAMi and Volcano place such a pod (their CheckUUID skips unknown UUIDs).
    known = inventory.mig_parents if hints.mode == "mig" else inventory.uuids
    missing = [u for u in hints.use_uuids if u not in known]
    if missing:
        key = next(n for n in (USE_GPUUUID, VOLCANO_USE_GPUUUID) if n in keys)
        what = "GPU with MIG partitions" if hints.mode == "mig" else "GPU"
        raise ManifestError(
            f"annotation {key}: no {what} in the cluster has UUID {', '.join(missing)}"
        )
    if hints.use_types and not any(
        type_matches(p, hints.use_types) for p in inventory.product_names
    ):
        types = ", ".join(sorted(hami_type(p) for p in inventory.product_names)) or "none"
        raise ManifestError(
            f"annotation {USE_GPUTYPE}: no GPU in the cluster is of type "
            f"{', '.join(hints.use_types)} (the cluster's GPU types: {types})"
        )
