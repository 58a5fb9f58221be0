"""Semantic validation of ResourceSlices: the ``resource.k8s.io/v1`` limits the OpenAPI schema
does not express (reference §2.1), as the API server enforces them.

Contract: :func:`validate_device`, :func:`validate_slice` and :func:`validate_pool` raise
:class:`~driver.api.errors.ValidationError` naming the slice, device and field (attribute count
and name lengths, value lengths, device-name format and uniqueness, per-slice device limits,
taint count and effects, request-policy consistency, shared counters, one nodeSelector term).
They never mutate their input. Used by the slice builder on everything it returns, by the API
emulator's admission, and wherever slices are read from files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from driver.api.errors import ValidationError
from driver.api.model import AttributeValue, Capacity, Device, ResourceSlice, Version

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


# --------------------------------------------------------------------------- formats

_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_C_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
SEMVER: Final = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)


# --------------------------------------------------------------------------- validation


def check_subdomain(value: str, what: str, max_length: int) -> None:
    if not value or len(value) > max_length or not DNS_SUBDOMAIN.fullmatch(value):
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


# What has been found valid once is valid again: slices repeat the same few attribute names,
# versions and capacities on every device of every node (bounded, like the parse memos).
_VALID_MAX: Final = 100_000
_VALID_NAMES: set[str] = set()
_VALID_VERSIONS: set[str] = set()
_VALID_CAPACITIES: set[tuple[str, Capacity, bool]] = set()


def _remember(known: set[Any], item: Any) -> None:
    if len(known) >= _VALID_MAX:
        known.clear()
    known.add(item)


def check_qualified_name(key: str, where: str) -> None:
    """A QualifiedName: ``<C identifier>`` or ``<DNS subdomain>/<C identifier>`` (§2.1)."""
    if key in _VALID_NAMES:
        return
    domain, sep, ident = key.rpartition("/")
    if sep and (len(domain) > MAX_DOMAIN_LENGTH or not DNS_SUBDOMAIN.fullmatch(domain)):
        raise ValidationError(
            f"{where}: domain {domain!r} of {key!r} must be a DNS subdomain of at most "
            f"{MAX_DOMAIN_LENGTH} characters"
        )
    if len(ident) > MAX_ID_LENGTH or not _C_IDENTIFIER.fullmatch(ident):
        raise ValidationError(
            f"{where}: name {ident!r} of {key!r} must be a C identifier of at most "
            f"{MAX_ID_LENGTH} characters"
        )
    _remember(_VALID_NAMES, key)


def _check_value(value: AttributeValue, where: str) -> int:
    """Check one attribute value; return how many individual values it holds."""
    items: tuple[object, ...] = value if isinstance(value, tuple) else (value,)
    if not items:
        raise ValidationError(f"{where}: list attributes must not be empty")
    for item in items:
        if isinstance(item, str) and len(item) > MAX_VALUE_LENGTH:
            raise ValidationError(f"{where}: string longer than {MAX_VALUE_LENGTH} characters")
        if isinstance(item, Version) and item.text not in _VALID_VERSIONS:
            if len(item.text) > MAX_VALUE_LENGTH:
                raise ValidationError(f"{where}: version longer than {MAX_VALUE_LENGTH} characters")
            if not SEMVER.fullmatch(item.text):
                raise ValidationError(f"{where}: version {item.text!r} is not semver 2.0.0")
            _remember(_VALID_VERSIONS, item.text)
    return len(items)


def _check_capacity(name: str, cap: Capacity, device: Device, where: str) -> None:
    known = (name, cap, device.allow_multiple_allocations)
    if known in _VALID_CAPACITIES:
        return
    _check_capacity_once(name, cap, device, where)
    _remember(_VALID_CAPACITIES, known)


def _check_capacity_once(name: str, cap: Capacity, device: Device, where: str) -> None:
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
        if key not in _VALID_NAMES:
            check_qualified_name(key, f"{where} attribute")
        if type(value) is str and len(value) <= MAX_VALUE_LENGTH:
            values += 1  # the common case, checked inline
        else:
            values += _check_value(value, f"{where} attribute {key!r}")
    if values > MAX_ATTRIBUTE_VALUES:
        raise ValidationError(
            f"{where}: {values} attribute values, at most {MAX_ATTRIBUTE_VALUES} are allowed"
        )
    for key, cap in device.capacity.items():
        if key not in _VALID_NAMES:
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
    seen_sets: set[str] = set()
    for consumption in device.consumes_counters:
        _check_label(consumption.name, f"{where}: consumesCounters counterSet")
        if consumption.name in seen_sets:
            raise ValidationError(
                f"{where}: consumes from counter set {consumption.name!r} twice (one entry per set)"
            )
        seen_sets.add(consumption.name)
        if len(consumption.counters) > MAX_COUNTERS_PER_SET:
            raise ValidationError(f"{where}: more than {MAX_COUNTERS_PER_SET} counters in a set")


def _is_label_key(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and (len(prefix) > MAX_OBJECT_NAME_LENGTH or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= MAX_LABEL_LENGTH and _LABEL_NAME.fullmatch(name) is not None


def validate_slice(resource_slice: ResourceSlice) -> None:
    """Check one ResourceSlice against the v1 limits the OpenAPI schema does not enforce.

    Raises :class:`~driver.api.errors.ValidationError` naming the slice, the device and the field.
    Reusable by anything that accepts slices (the API emulator, the controller's cache).
    """
    s = resource_slice
    where = f"ResourceSlice {s.name or s.generate_name or '<unnamed>'!r}: "
    if s.name:
        check_subdomain(s.name, f"{where}name", MAX_OBJECT_NAME_LENGTH)
    check_subdomain(s.driver, f"{where}driver", MAX_DRIVER_NAME_LENGTH)
    pool = s.pool.name
    if (
        not pool
        or len(pool) > MAX_POOL_NAME_LENGTH
        or not all(DNS_SUBDOMAIN.fullmatch(part) for part in pool.split("/"))
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
        check_subdomain(s.node_name, f"{where}nodeName", MAX_OBJECT_NAME_LENGTH)
    _check_single_term(s.node_selector, f"{where}nodeSelector")
    if s.devices and s.shared_counters:
        raise ValidationError(f"{where}a slice holds devices or sharedCounters, never both")
    if len(s.shared_counters) > MAX_SHARED_COUNTER_SETS:
        raise ValidationError(f"{where}at most {MAX_SHARED_COUNTER_SETS} sharedCounters sets")
    for counter_set in s.shared_counters:
        _check_label(counter_set.name, f"{where}counter set name")
        if len(counter_set.counters) > MAX_COUNTERS_PER_SET:
            raise ValidationError(
                f"{where}counter set {counter_set.name!r}: more than {MAX_COUNTERS_PER_SET} "
                "counters"
            )
        for name in counter_set.counters:
            _check_label(name, f"{where}counter set {counter_set.name!r}: counter")
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
    device names across slices, ``resourceSliceCount`` equal to the number of slices, counter
    set names unique in the pool, and every ``consumesCounters`` entry naming a counter set and
    counters of the pool (a pool breaking either is one the scheduler's allocator marks
    invalid and skips)."""
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
    counters: dict[str, frozenset[str]] = {}
    for s in slices:
        for counter_set in s.shared_counters:
            if counter_set.name in counters:
                raise ValidationError(
                    f"pool {s.pool.name!r}: counter set {counter_set.name!r} appears twice"
                )
            counters[counter_set.name] = frozenset(counter_set.counters)
    for s in slices:
        for device in s.devices:
            for consumption in device.consumes_counters:
                known = counters.get(consumption.name)
                if known is None:
                    raise ValidationError(
                        f"pool {s.pool.name!r}: device {device.name!r} consumes from counter "
                        f"set {consumption.name!r}, which no slice of the pool defines"
                    )
                unknown = sorted(set(consumption.counters) - known)
                if unknown:
                    raise ValidationError(
                        f"pool {s.pool.name!r}: device {device.name!r} consumes counter(s) "
                        f"{', '.join(unknown)} that counter set {consumption.name!r} lacks"
                    )
    if first.pool.resource_slice_count != len(slices):
        raise ValidationError(
            f"pool {first.pool.name!r}: resourceSliceCount is {first.pool.resource_slice_count} "
            f"but {len(slices)} slices were given"
        )
    slice_names = [s.name for s in slices if s.name]
    if len(set(slice_names)) != len(slice_names):
        raise ValidationError(f"pool {first.pool.name!r}: two slices share a name")
