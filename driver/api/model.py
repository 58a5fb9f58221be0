"""The one device model: ``resource.k8s.io/v1`` devices and slices as frozen, slotted dataclasses.

Discovery (``driver.discovery``) produces ``GpuInfo`` / ``MigInfo``; the slice builder turns
them into :class:`Device` and :class:`ResourceSlice`; the allocator, the scorer and the kubelet
plugin read the same objects. Raw API JSON is described with TypedDicts and converted once, at
the edge, by ``from_api()`` / ``to_api()``. ``to_api(from_api(x)) == x`` for every field this
module models (unknown fields are dropped on purpose: the core never round-trips them).

Nothing here mutates its inputs; mappings handed to a model are copied into new dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

import msgspec
from msgspec import UNSET, UnsetType

from driver.api.errors import ManifestError
from driver.api.ids import DriverName, NodeName, PoolName
from driver.api.quantity import Quantity
from driver.api.records import builder

API_GROUP = "resource.k8s.io"
API_VERSION = "resource.k8s.io/v1"

# --------------------------------------------------------------------------- raw API shapes

JSON = dict[str, Any]


class AttributeJSON(TypedDict, total=False):
    int: int
    bool: bool
    string: str
    version: str
    ints: list[int]
    bools: list[bool]
    strings: list[str]
    versions: list[str]


class CapacityJSON(TypedDict):
    value: str
    requestPolicy: NotRequired[JSON]


class DeviceJSON(TypedDict, total=False):
    name: str
    attributes: dict[str, AttributeJSON]
    capacity: dict[str, CapacityJSON]
    allowMultipleAllocations: bool
    consumesCounters: list[JSON]
    taints: list[JSON]
    nodeName: str
    nodeSelector: JSON
    allNodes: bool
    bindsToNode: bool
    bindingConditions: list[str]
    bindingFailureConditions: list[str]


def json_copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars): what ``copy.deepcopy`` gives for
    it, several times faster (no memo, no dispatch)."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    if isinstance(value, Mapping):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return value


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0, ``{}`` and ``[]`` are 1), counted level by
    level without recursion; the count stops at ``limit + 1`` (anything deeper than ``limit``)."""
    deepest = 0
    level: list[Any] = [value]
    while level and deepest <= limit:
        below: list[Any] = []
        containers = False
        for item in level:
            if isinstance(item, Mapping):
                below.extend(item.values())
                containers = True
            elif isinstance(item, (list, tuple)):
                below.extend(item)
                containers = True
        deepest += containers
        level = below
    return deepest


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Version:
    """A ``version`` attribute (semver 2.0.0 text); kept apart from plain strings for CEL."""

    text: str

    def __str__(self) -> str:
        return self.text


ScalarValue = bool | int | str | Version
AttributeValue = (
    ScalarValue | tuple[bool, ...] | tuple[int, ...] | tuple[str, ...] | tuple[Version, ...]
)

_LIST_KEYS = {"ints": int, "bools": bool, "strings": str, "versions": Version}


_MEMO_MAX: Final = 200_000
_STRINGS: dict[str, str] = {}
_VERSIONS: dict[str, Version] = {}
#: Per published capacity value, the request policies met with it and their parsed capacity
#: (a policy is compared as published; a few per value).
_CAPACITIES: dict[object, list[tuple[object, Capacity]]] = {}
_POLICIES_PER_VALUE: Final = 8
#: A device's capacity map, one per distinct map (names in order, the parsed capacities by
#: identity): the GPUs of one model publish the same capacities thousands of times.
_CAPACITY_MAPS: dict[tuple[object, ...], dict[str, Capacity]] = {}
_CAPACITY_MAPS_MAX: Final = 4096


def _shared(memo: dict[Any, Any], key: Any, value: Any) -> Any:
    """One object per distinct value across every parsed slice (5,000 nodes publish the same
    product names, versions and capacities thousands of times); the memo is bounded."""
    found = memo.get(key)
    if found is None:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = found = value
    return found


def _attributes(raw: Any, device: str) -> dict[str, AttributeValue]:
    """A device's attributes: the common shapes (one value of its exact type) on a fast path,
    strings and versions shared across devices; anything else through
    :func:`attribute_from_api`, which checks it and names what is wrong. The fast path looks
    each kind up by name (a published attribute is a one-key map, mostly ``string``), which
    costs less than unpacking the map's one item."""
    out: dict[str, AttributeValue] = {}
    strings, versions = _STRINGS, _VERSIONS
    for key, value_raw in raw.items():
        if type(value_raw) is dict and len(value_raw) == 1:
            value = value_raw.get("string")
            if value is not None:
                if type(value) is str:
                    found = strings.get(value)
                    out[key] = found if found is not None else _shared(strings, value, value)
                    continue
            elif (value := value_raw.get("int")) is not None:
                if type(value) is int:
                    out[key] = value
                    continue
            elif (value := value_raw.get("version")) is not None:
                if type(value) is str:
                    version = versions.get(value)
                    out[key] = (
                        version if version is not None else _shared(versions, value, Version(value))
                    )
                    continue
            elif type(value := value_raw.get("bool")) is bool:
                out[key] = value
                continue
        out[key] = attribute_from_api(value_raw, f"device {device!r} attribute {key!r}")
    return out


def attribute_from_api(raw: Mapping[str, Any], where: str) -> AttributeValue:
    """Convert one ``DeviceAttribute`` (exactly one of int/bool/string/version/lists)."""
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ManifestError(
            f"{where}: an attribute must set exactly one of int, bool, string, version"
        )
    ((kind, value),) = raw.items()
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "version" and isinstance(value, str):
        return Version(value)
    if kind in _LIST_KEYS and isinstance(value, list) and value:
        if kind == "versions":
            return tuple(Version(str(v)) for v in value)
        return tuple(value)
    raise ManifestError(f"{where}: unsupported attribute value {dict(raw)!r}")


def attribute_to_api(value: AttributeValue) -> AttributeJSON:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, str):
        return {"string": value}
    if isinstance(value, Version):
        return {"version": value.text}
    if value and isinstance(value[0], Version):
        return {"versions": [v.text for v in value]}
    if value and isinstance(value[0], bool):
        return {"bools": [cast(bool, v) for v in value]}
    if value and isinstance(value[0], int):
        return {"ints": list(value)}
    return {"strings": [str(v) for v in value]}


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True, slots=True)
class ValidRange:
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """``CapacityRequestPolicy``: a default plus at most one of validValues / validRange."""

    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    valid_range: ValidRange | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> RequestPolicy:
        rng = raw.get("validRange")
        return cls(
            default=Quantity.of(raw["default"]) if raw.get("default") is not None else None,
            valid_values=tuple(Quantity.of(v) for v in raw.get("validValues") or ()),
            valid_range=ValidRange(
                min=Quantity.of(rng["min"]),
                max=Quantity.of(rng["max"]) if rng.get("max") is not None else None,
                step=Quantity.of(rng["step"]) if rng.get("step") is not None else None,
            )
            if rng
            else None,
        )

    def to_api(self) -> JSON:
        out: JSON = {}
        if self.default is not None:
            out["default"] = str(self.default)
        if self.valid_values:
            out["validValues"] = [str(v) for v in self.valid_values]
        if self.valid_range is not None:
            rng: JSON = {"min": str(self.valid_range.min)}
            if self.valid_range.max is not None:
                rng["max"] = str(self.valid_range.max)
            if self.valid_range.step is not None:
                rng["step"] = str(self.valid_range.step)
            out["validRange"] = rng
        return out


_POLICY_KEYS: Final = frozenset({"default", "validValues", "validRange"})
_RANGE_KEYS: Final = frozenset({"min", "max", "step"})


def _plain_policy(policy: Any) -> bool:
    """Whether a request policy that parsed has only the fields it reads (then it nests
    three levels at most: comparing it with another policy stays shallow)."""
    if type(policy) is not dict or not policy.keys() <= _POLICY_KEYS:
        return False
    rng, values = policy.get("validRange"), policy.get("validValues")
    return (not rng or (type(rng) is dict and rng.keys() <= _RANGE_KEYS)) and (
        values is None or type(values) is list
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Quantity
    request_policy: RequestPolicy | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Capacity:
        value = raw["value"]
        policy = raw.get("requestPolicy")
        # Only published strings are kept and looked up: a string equals only a string, so
        # a value or policy that would not parse (``True`` for ``1``) never matches one that
        # did.
        kept = _CAPACITIES.get(value) if type(value) is str else None
        if kept is not None:
            for known, parsed in kept:
                if known == policy:  # (one C-level comparison of the published policy)
                    return parsed
        parsed = cls(
            value=Quantity.of(value),
            request_policy=RequestPolicy.from_api(policy) if policy is not None else None,
        )
        if type(value) is str and (
            policy is None or (_plain_policy(policy) and _strings_only(policy, 2))
        ):
            kept = _shared(_CAPACITIES, value, [])
            if len(kept) < _POLICIES_PER_VALUE:
                kept.append((json_copy(policy), parsed))
        return parsed

    def to_api(self) -> CapacityJSON:
        out: CapacityJSON = {"value": str(self.value)}
        if self.request_policy is not None:
            out["requestPolicy"] = self.request_policy.to_api()
        return out


def _capacity_map(capacity: dict[str, Capacity]) -> dict[str, Capacity]:
    """``capacity``, or an equal map parsed before with the same names in the same order and
    the same capacity objects (:meth:`Capacity.from_api` shares them): devices alike then
    share one map, which the allocator's per-map caches recognise by identity. The key holds
    the capacities' ids, and the kept map the capacities: an id is not reused while kept."""
    key = (*capacity, *map(id, capacity.values()))
    found = _CAPACITY_MAPS.get(key)
    if found is None:
        if len(_CAPACITY_MAPS) >= _CAPACITY_MAPS_MAX:
            _CAPACITY_MAPS.clear()  # (capacities not shared make every map distinct)
        found = _CAPACITY_MAPS[key] = capacity
    return found


#: A device's published capacity map (a copy, strings only) -> its parsed map, a few per list
#: of names: the devices of one model publish equal maps, found again by one C-level
#: comparison instead of being read entry by entry.
_PUBLISHED_MAPS: dict[tuple[str, ...], list[tuple[JSON, Mapping[str, Capacity]]]] = {}
_PUBLISHED_PER_NAMES: Final = 16


def _capacities(raw: Any) -> Mapping[str, Capacity]:
    """A device's capacities (``raw``: its published ``capacity``), shared as
    :func:`_capacity_map` shares them. A map equal to one parsed before is that map: only
    maps of strings (and nulls) are kept, and a string equals only a string, so a value that
    would not parse (``True`` for ``1``) never matches one that did."""
    names = tuple(raw) if type(raw) is dict else None
    kept = _PUBLISHED_MAPS.get(names) if names is not None else None
    if kept is not None:
        for known, parsed in kept:
            if known == raw:
                return parsed
    parsed = _capacity_map({k: Capacity.from_api(v) for k, v in raw.items()})
    if names is not None and _strings_only(raw, 4):
        if kept is None:
            if len(_PUBLISHED_MAPS) >= _CAPACITY_MAPS_MAX:
                _PUBLISHED_MAPS.clear()
            kept = _PUBLISHED_MAPS[names] = []
        if len(kept) < _PUBLISHED_PER_NAMES:
            kept.append((json_copy(raw), parsed))
    return parsed


def _strings_only(value: Any, depth: int) -> bool:
    """Whether ``value`` is strings and nulls in maps and lists at most ``depth`` deep."""
    if value is None or type(value) is str:
        return True
    if depth == 0:
        return False
    if type(value) is dict:
        return all(type(k) is str and _strings_only(v, depth - 1) for k, v in value.items())
    if type(value) is list:
        return all(_strings_only(v, depth - 1) for v in value)
    return False


# --------------------------------------------------------------------------- taints, counters

TaintEffect = Literal["None", "NoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    effect: str
    value: str = ""
    time_added: str | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> DeviceTaint:
        return cls(
            key=raw["key"],
            effect=raw.get("effect", ""),
            value=raw.get("value", "") or "",
            time_added=raw.get("timeAdded"),
        )

    def to_api(self) -> JSON:
        out: JSON = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True, slots=True)
class CounterSet:
    """``sharedCounters[]`` entry of a slice, or ``consumesCounters[]`` entry of a device."""

    name: str
    counters: Mapping[str, Quantity]

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], *, name_key: str = "name") -> CounterSet:
        return cls(
            name=raw[name_key],
            counters={k: Quantity.of(v["value"]) for k, v in (raw.get("counters") or {}).items()},
        )

    def to_api(self, *, name_key: str = "name") -> JSON:
        return {
            name_key: self.name,
            "counters": {k: {"value": str(v)} for k, v in sorted(self.counters.items())},
        }


# --------------------------------------------------------------------------- devices

_PLAIN_DEVICE_KEYS: Final = frozenset(
    {"name", "attributes", "capacity", "allowMultipleAllocations"}
)


@dataclass(frozen=True, slots=True)
class Device:
    """One ``resource.k8s.io/v1`` Device. Attribute and capacity keys are as published:
    unqualified keys belong to the driver's domain."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    allow_multiple_allocations: bool = False
    consumes_counters: tuple[CounterSet, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    node_name: NodeName | None = None
    node_selector: JSON | None = None
    all_nodes: bool = False
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Device:
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError("device without a name")
        try:
            attributes = _attributes(raw.get("attributes") or {}, name)
            capacity = _capacities(raw.get("capacity") or {})
            multi = bool(raw.get("allowMultipleAllocations"))
            if raw.keys() <= _PLAIN_DEVICE_KEYS:
                # What most published devices are (a GPU with attributes and capacities): the
                # fields it does not set keep their defaults, as the full reading gives them.
                return _new_device(name, attributes, capacity, multi)
            return cls(
                name=name,
                attributes=attributes,
                capacity=capacity,
                allow_multiple_allocations=multi,
                consumes_counters=tuple(
                    CounterSet.from_api(c, name_key="counterSet")
                    for c in raw.get("consumesCounters") or ()
                ),
                taints=tuple(DeviceTaint.from_api(t) for t in raw.get("taints") or ()),
                node_name=NodeName(raw["nodeName"]) if raw.get("nodeName") else None,
                node_selector=raw.get("nodeSelector"),
                all_nodes=bool(raw.get("allNodes")),
                binds_to_node=bool(raw.get("bindsToNode")),
                binding_conditions=tuple(raw.get("bindingConditions") or ()),
                binding_failure_conditions=tuple(raw.get("bindingFailureConditions") or ()),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"device {name!r}: malformed ({exc})") from exc

    def to_api(self) -> DeviceJSON:
        out: DeviceJSON = {"name": self.name}
        if self.attributes:
            out["attributes"] = {k: attribute_to_api(v) for k, v in sorted(self.attributes.items())}
        if self.capacity:
            out["capacity"] = {k: v.to_api() for k, v in sorted(self.capacity.items())}
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.consumes_counters:
            out["consumesCounters"] = [
                c.to_api(name_key="counterSet") for c in self.consumes_counters
            ]
        if self.taints:
            out["taints"] = [t.to_api() for t in self.taints]
        if self.node_name:
            out["nodeName"] = self.node_name
        if self.node_selector is not None:
            out["nodeSelector"] = self.node_selector
        if self.all_nodes:
            out["allNodes"] = True
        if self.binds_to_node:
            out["bindsToNode"] = True
        if self.binding_conditions:
            out["bindingConditions"] = list(self.binding_conditions)
        if self.binding_failure_conditions:
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        return out

    @property
    def uses_advanced_features(self) -> bool:
        """Taints, counters or list attributes: the slice's device limit drops to 64."""
        return bool(self.taints or self.consumes_counters) or any(
            isinstance(v, tuple) for v in self.attributes.values()
        )


#: Every published GPU is parsed at start-up (88,000 devices at 10,000 mixed nodes): built
#: without the frozen ``__init__`` (:mod:`driver.api.records`).
_new_device: Final = builder(Device)


# --------------------------------------------------------------------------- slices


@dataclass(frozen=True, slots=True)
class Pool:
    name: PoolName
    generation: int
    resource_slice_count: int


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ``ResourceSlice``: exactly one node-selection field; devices or shared counters."""

    name: str
    driver: DriverName
    pool: Pool
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()
    node_name: NodeName | None = None
    node_selector: JSON | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    generation: int = 0  # metadata.generation, for CEL result caching
    uid: str = ""
    owner_references: tuple[JSON, ...] = ()
    generate_name: str = ""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> ResourceSlice:
        meta = raw.get("metadata") or {}
        spec = raw.get("spec")
        name = meta.get("name") or meta.get("generateName") or "<unnamed>"
        if not isinstance(spec, Mapping):
            raise ManifestError(f"ResourceSlice {name!r}: missing spec")
        try:
            pool = spec["pool"]
            return _new_slice(
                name=meta.get("name", ""),
                generate_name=meta.get("generateName", ""),
                driver=DriverName(spec["driver"]),
                pool=_new_pool(
                    name=PoolName(pool["name"]),
                    generation=int(pool.get("generation", 0)),
                    resource_slice_count=int(pool.get("resourceSliceCount", 1)),
                ),
                devices=tuple([_device(d) for d in spec.get("devices") or ()]),
                shared_counters=tuple(
                    CounterSet.from_api(c) for c in spec.get("sharedCounters") or ()
                ),
                node_name=NodeName(spec["nodeName"]) if spec.get("nodeName") else None,
                node_selector=spec.get("nodeSelector"),
                all_nodes=bool(spec.get("allNodes")),
                per_device_node_selection=bool(spec.get("perDeviceNodeSelection")),
                generation=int(meta.get("generation", 0)),
                uid=meta.get("uid", ""),
                owner_references=tuple(meta.get("ownerReferences") or ()),
            )
        except ManifestError as exc:
            raise ManifestError(f"ResourceSlice {name!r}: {exc}") from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"ResourceSlice {name!r}: malformed spec ({exc})") from exc

    @classmethod
    def from_wire(cls, wire: WireSlice) -> ResourceSlice | None:
        """What :meth:`from_api` gives for the object ``wire`` was decoded from, read from
        the typed form (no dicts per device and attribute in between); None where that form
        does not decide: a device attribute that is not exactly one of int, bool, string,
        version; an empty device name; a value :meth:`from_api` would refuse. The caller
        then reads the object's JSON with :meth:`from_api`, which gives the model or the
        error. :class:`WireSlice` admits only the common form (a node-local slice of plain
        devices: every other field makes the decoding fail, so :meth:`from_api` reads it);
        the rest of its checks are here."""
        try:
            meta, spec = wire.metadata, wire.spec
            pool = spec.pool
            devices = []
            for device in spec.devices:
                name = device.name
                attributes = _wire_attributes(device.attributes)
                if not name or attributes is None:
                    return None
                devices.append(
                    _new_device(
                        name,
                        attributes,
                        _wire_capacities(device.capacity),
                        device.allowMultipleAllocations,
                    )
                )
            return _new_slice(
                name=meta.get("name", ""),
                generate_name=meta.get("generateName", ""),
                driver=DriverName(spec.driver),
                pool=_new_pool(
                    name=PoolName(pool.name),
                    generation=pool.generation,
                    resource_slice_count=pool.resourceSliceCount,
                ),
                devices=tuple(devices),
                node_name=NodeName(spec.nodeName) if spec.nodeName else None,
                generation=int(meta.get("generation", 0)),
                uid=meta.get("uid", ""),
                owner_references=tuple(meta.get("ownerReferences") or ()),
            )
        except Exception:  # noqa: BLE001 - from_api reads it again and names what is wrong
            return None

    def to_api(self) -> JSON:
        meta: JSON = {}
        if self.name:
            meta["name"] = self.name
        if self.generate_name:
            meta["generateName"] = self.generate_name
        if self.owner_references:
            meta["ownerReferences"] = [dict(o) for o in self.owner_references]
        spec: JSON = {
            "driver": self.driver,
            "pool": {
                "name": self.pool.name,
                "generation": self.pool.generation,
                "resourceSliceCount": self.pool.resource_slice_count,
            },
        }
        if self.node_name:
            spec["nodeName"] = self.node_name
        if self.node_selector is not None:
            spec["nodeSelector"] = self.node_selector
        if self.all_nodes:
            spec["allNodes"] = True
        if self.per_device_node_selection:
            spec["perDeviceNodeSelection"] = True
        if self.devices:
            spec["devices"] = [d.to_api() for d in self.devices]
        if self.shared_counters:
            spec["sharedCounters"] = [c.to_api() for c in self.shared_counters]
        return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


#: Every published slice is parsed at start-up (10,000 at 10,000 mixed nodes): built without
#: the frozen ``__init__`` (:mod:`driver.api.records`), as its devices are.
_new_slice: Final = builder(ResourceSlice)
_new_pool: Final = builder(Pool)
_device: Final = Device.from_api


# --------------------------------------------------------------------------- the wire form
# A ResourceSlice list item as the decoder reads it straight from the JSON text
# (kubeapi.codec.loads_list): the common form only, every field of its exact JSON type. An
# unknown field, a null or a value of another type fails the decoding, and the item is then
# read as JSON data by ResourceSlice.from_api, as any other; so what these admit is read here
# exactly as from_api reads it (a test pins both readings equal, malformed items included).


class _WireAttribute(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A ``DeviceAttribute`` of one scalar kind (lists are read by :meth:`Device.from_api`)."""

    integer: int | UnsetType = msgspec.field(default=UNSET, name="int")
    boolean: bool | UnsetType = msgspec.field(default=UNSET, name="bool")
    string: str | UnsetType = UNSET
    version: str | UnsetType = UNSET


class _WireRange(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    min: str | UnsetType = UNSET
    max: str | UnsetType = UNSET
    step: str | UnsetType = UNSET


class _WirePolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    default: str | UnsetType = UNSET
    validValues: tuple[str, ...] | UnsetType = UNSET  # noqa: N815 - the API's field name
    validRange: _WireRange | UnsetType = UNSET  # noqa: N815


class _WireCapacity(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    """A ``DeviceCapacity`` of strings (hashable: devices alike are found by it)."""

    value: str | UnsetType = UNSET
    requestPolicy: _WirePolicy | UnsetType = UNSET  # noqa: N815


class _WireDevice(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A device with a name, attributes, capacities and multiple allocations only. Its
    capacities stay text until read (:func:`_wire_capacities`): devices alike publish the
    same text, read once."""

    name: str
    attributes: dict[str, _WireAttribute] = {}
    capacity: msgspec.Raw | UnsetType = UNSET
    allowMultipleAllocations: bool = False  # noqa: N815


class _WirePool(msgspec.Struct):
    # (other fields ignored, as from_api ignores them)
    name: str
    generation: int = 0
    resourceSliceCount: int = 1  # noqa: N815


class _WireSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A slice's spec with a ``nodeName`` at most: ``nodeSelector``, ``allNodes``,
    ``perDeviceNodeSelection`` and ``sharedCounters`` are read by :meth:`from_api`."""

    driver: str
    pool: _WirePool
    nodeName: str | None = None  # noqa: N815
    devices: list[_WireDevice] = []


class WireSlice(msgspec.Struct, forbid_unknown_fields=True):
    """A ResourceSlice list item in its common form (see above); ``metadata`` as JSON data,
    since readers check its envelope as for any object."""

    metadata: dict[str, Any]
    spec: _WireSpec
    apiVersion: Any = None  # noqa: N815 - the API's field names
    kind: Any = None


def _wire_attributes(raw: dict[str, _WireAttribute]) -> dict[str, AttributeValue] | None:
    """:func:`_attributes` of the typed form; None when an attribute does not set exactly
    one kind."""
    out: dict[str, AttributeValue] = {}
    strings, versions = _STRINGS, _VERSIONS
    # Shared as _shared shares them, in one call a value (a device's uuid is new every
    # time); bounded here, once a device, rather than at each insertion.
    if len(strings) >= _MEMO_MAX:
        strings.clear()
    for key, attribute in raw.items():
        string, integer, boolean, version = (
            attribute.string,
            attribute.integer,
            attribute.boolean,
            attribute.version,
        )
        if string is not UNSET:
            if integer is not UNSET or boolean is not UNSET or version is not UNSET:
                return None
            out[key] = strings.setdefault(string, string)
        elif integer is not UNSET:
            if boolean is not UNSET or version is not UNSET:
                return None
            out[key] = integer
        elif version is not UNSET:
            if boolean is not UNSET:
                return None
            known = versions.get(version)
            out[key] = known if known is not None else _shared(versions, version, Version(version))
        elif boolean is not UNSET:
            out[key] = boolean
        else:
            return None
    return out


_WIRE_CAPACITY_MAP: Final = msgspec.json.Decoder(dict[str, _WireCapacity])
#: A device's capacity map as published (its text) -> the map :func:`_capacities` gives for
#: its JSON data.
_WIRE_CAPACITIES: dict[bytes, Mapping[str, Capacity]] = {}


def _wire_capacities(raw: msgspec.Raw | UnsetType) -> Mapping[str, Capacity]:
    """:func:`_capacities` of a device's published capacity map (its text; UNSET: none),
    each distinct text read once, typed (``ValidationError`` where the typed form does not
    admit it), then from the JSON data it stands for (its fields as published, in its names'
    order)."""
    if raw is UNSET:
        return _capacities({})
    text = bytes(raw)
    found = _WIRE_CAPACITIES.get(text)
    if found is None:
        typed = _WIRE_CAPACITY_MAP.decode(text)
        found = _capacities({name: msgspec.to_builtins(c) for name, c in typed.items()})
        if len(_WIRE_CAPACITIES) >= _CAPACITY_MAPS_MAX:
            _WIRE_CAPACITIES.clear()
        _WIRE_CAPACITIES[text] = found
    return found
