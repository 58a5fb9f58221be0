"""DeviceClasses, ResourceClaims and allocation results as frozen, slotted dataclasses.

Everything here is converted once, at the edge, from raw ``resource.k8s.io/v1`` JSON with
``from_api()``; :class:`AllocationResult` converts back with ``to_api()`` to exactly the v1
``status.allocation`` object. The allocator reads only these models.

Contract:

* ``from_api()`` never mutates its input and copies every mapping it keeps; malformed objects
  raise :class:`~driver.api.errors.ManifestError` naming the object and the field.
* API defaults are applied as the API server applies them: ``allocationMode`` defaults to
  ``ExactCount``, ``count`` to 1 (ExactCount only), a toleration's ``operator`` to ``Equal``.
* The models are immutable values; mappings inside them are private copies (never the
  input's). Claims parsed with one :class:`SpecMemo` may share their request, constraint and
  config models with each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from driver.api.errors import ManifestError, QuantityError
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.api.model import JSON, DeviceTaint, json_copy, json_depth
from driver.api.quantity import Quantity
from driver.api.records import builder

AllocationMode = Literal["ExactCount", "All"]
ConfigSource = Literal["FromClass", "FromClaim"]

#: ``resourceapi.AllocationResultsMaxSize``: at most this many devices per claim.
ALLOCATION_RESULTS_MAX_SIZE: Final = 32

_MODES: Final = ("ExactCount", "All")


def _where(kind: str, raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _selectors(raw: Any, where: str) -> tuple[str, ...]:
    """``[]DeviceSelector`` -> the CEL expressions, in order."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: selectors must be a list")
    out: list[str] = []
    for i, selector in enumerate(raw):
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expression, str) or not expression:
            raise ManifestError(
                f"{where}: selector #{i} has no cel.expression (unsupported selector type?)"
            )
        out.append(expression)
    return tuple(out)


# --------------------------------------------------------------------------- config

#: How deep opaque parameters may nest for biaxial to read and pass them on (the API server
#: accepts up to 10,000 levels within its 10 KiB limit; a real configuration needs a handful).
#: Deeper ones are that claim's or class's error, reported to the pods that use it.
MAX_PARAMETER_DEPTH: Final = 64


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """``OpaqueDeviceConfiguration``: parameters for one driver, passed through untouched."""

    driver: str
    parameters: Mapping[str, Any]

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> OpaqueConfig:
        opaque = raw.get("opaque") if isinstance(raw, Mapping) else None
        if not isinstance(opaque, Mapping):
            raise ManifestError(f"{where}: config entry without opaque (unsupported config type?)")
        driver = opaque.get("driver")
        if not isinstance(driver, str) or not driver:
            raise ManifestError(f"{where}: opaque config without a driver")
        parameters = opaque.get("parameters")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, Mapping):
            raise ManifestError(f"{where}: opaque parameters must be an object")
        if json_depth(parameters, MAX_PARAMETER_DEPTH) > MAX_PARAMETER_DEPTH:
            raise ManifestError(
                f"{where}: opaque parameters nest deeper than {MAX_PARAMETER_DEPTH} levels; "
                "biaxial passes parameters on up to that depth"
            )
        return cls(driver=driver, parameters=json_copy(parameters))

    def to_api(self) -> JSON:
        """The ``DeviceConfiguration`` object: ``{"opaque": {"driver", "parameters"}}``."""
        return {"opaque": {"driver": self.driver, "parameters": json_copy(self.parameters)}}


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    """``DeviceClaimConfiguration``: opaque config for some requests (empty = all)."""

    requests: tuple[str, ...]
    opaque: OpaqueConfig


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A ``DeviceClass``: selectors every device must match, plus config for allocations."""

    name: str
    selectors: tuple[str, ...] = ()
    config: tuple[OpaqueConfig, ...] = ()
    extended_resource_name: str | None = None
    creation_timestamp: str = ""
    uid: str = ""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> DeviceClass:
        where = _where("DeviceClass", raw)
        meta = raw.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: metadata.name is required")
        spec = raw.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ManifestError(f"{where}: spec must be an object")
        ext = spec.get("extendedResourceName")
        if ext is not None and not isinstance(ext, str):
            raise ManifestError(f"{where}: spec.extendedResourceName must be a string")
        return cls(
            name=name,
            selectors=_selectors(spec.get("selectors"), f"{where}: spec"),
            config=tuple(
                OpaqueConfig.from_api(c, f"{where}: spec.config[{i}]")
                for i, c in enumerate(spec.get("config") or ())
            ),
            extended_resource_name=ext or None,
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            uid=str(meta.get("uid") or ""),
        )


# --------------------------------------------------------------------------- tolerations


@dataclass(frozen=True, slots=True)
class Toleration:
    """``DeviceToleration``; ``operator`` is ``Equal`` (the API default) or ``Exists``."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> Toleration:
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: a toleration must be an object")
        operator = raw.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            raise ManifestError(f"{where}: unknown toleration operator {operator!r}")
        seconds = raw.get("tolerationSeconds")
        if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
            raise ManifestError(f"{where}: tolerationSeconds must be an integer")
        return cls(
            key=str(raw.get("key") or ""),
            operator=operator,
            value=str(raw.get("value") or ""),
            effect=str(raw.get("effect") or ""),
            toleration_seconds=seconds,
        )

    def to_api(self) -> JSON:
        out: JSON = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def tolerates(self, taint: DeviceTaint) -> bool:
        """Upstream ``ToleratesTaint``: effect (empty = all), key (empty + Exists = all keys),
        then ``Exists`` matches any value and ``Equal`` needs the same value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


# --------------------------------------------------------------------------- requests


def _capacity_requests(raw: Any, where: str) -> Mapping[str, Quantity]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: capacity must be an object")
    requests = raw.get("requests") or {}
    if not isinstance(requests, Mapping):
        raise ManifestError(f"{where}: capacity.requests must be an object")
    out: dict[str, Quantity] = {}
    for key, value in requests.items():
        try:
            out[str(key)] = Quantity.of(value)
        except QuantityError as exc:
            raise ManifestError(f"{where}: capacity.requests[{key!r}]: {exc}") from exc
    return out


def _exact_fields(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The fields ExactDeviceRequest and DeviceSubRequest share, with API defaults."""
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: must be an object")
    cls_name = raw.get("deviceClassName")
    if not isinstance(cls_name, str) or not cls_name:
        raise ManifestError(f"{where}: deviceClassName is required")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in _MODES:
        raise ManifestError(f"{where}: unsupported allocationMode {mode!r}")
    count = raw.get("count")
    if mode == "ExactCount":
        if count is None:
            count = 1
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ManifestError(f"{where}: count must be a positive integer, got {count!r}")
    elif count is not None:
        raise ManifestError(f"{where}: count must not be set with allocationMode All")
    else:
        count = 0
    return {
        "device_class_name": cls_name,
        "selectors": _selectors(raw.get("selectors"), where),
        "allocation_mode": mode,
        "count": count,
        "tolerations": tuple(
            Toleration.from_api(t, f"{where}: tolerations[{i}]")
            for i, t in enumerate(raw.get("tolerations") or ())
        ),
        "capacity_requests": _capacity_requests(raw.get("capacity"), where),
    }


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """``ExactDeviceRequest``. ``count`` is 0 for ``All`` mode. ``capacity_requests`` applies to
    each allocated device."""

    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = "ExactCount"
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity_requests: Mapping[str, Quantity] = field(default_factory=dict)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> ExactRequest:
        fields = _exact_fields(raw, where)
        admin = raw.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            raise ManifestError(f"{where}: adminAccess must be a boolean")
        return cls(admin_access=bool(admin), **fields)


@dataclass(frozen=True, slots=True)
class SubRequest:
    """``DeviceSubRequest`` (one ``firstAvailable`` alternative); no admin access."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = "ExactCount"
    count: int = 1
    tolerations: tuple[Toleration, ...] = ()
    capacity_requests: Mapping[str, Quantity] = field(default_factory=dict)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> SubRequest:
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: name is required")
        return cls(name=name, **_exact_fields(raw, f"{where} ({name})"))

    @property
    def admin_access(self) -> bool:
        """Subrequests never have admin access (the API has no field for it)."""
        return False


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``DeviceRequest``: exactly one of ``exactly`` or ``first_available``."""

    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[SubRequest, ...] = ()

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> DeviceRequest:
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: request name is required")
        where = f"{where}, request {name!r}"
        exactly = raw.get("exactly")
        first = raw.get("firstAvailable")
        if (exactly is None) == (not first):
            raise ManifestError(f"{where}: exactly one of exactly or firstAvailable must be set")
        if exactly is not None:
            return cls(name=name, exactly=ExactRequest.from_api(exactly, f"{where}: exactly"))
        if not isinstance(first, list):
            raise ManifestError(f"{where}: firstAvailable must be a list")
        subs = tuple(
            SubRequest.from_api(s, f"{where}: firstAvailable[{i}]") for i, s in enumerate(first)
        )
        names = [s.name for s in subs]
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}: duplicate subrequest names in firstAvailable")
        return cls(name=name, first_available=subs)

    def choices(self) -> tuple[tuple[str, ExactRequest | SubRequest], ...]:
        """What the allocator may use for this request, each with the name results and
        config use for it: ``(name, exactly)``, or ``(name/sub, subrequest)`` per
        ``firstAvailable`` alternative."""
        if self.exactly is not None:
            return ((self.name, self.exactly),)
        return tuple((f"{self.name}/{s.name}", s) for s in self.first_available)


@dataclass(frozen=True, slots=True)
class Constraint:
    """``DeviceConstraint``: ``requests`` (empty = all) plus exactly one attribute rule."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> Constraint:
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: must be an object")
        match = raw.get("matchAttribute")
        distinct = raw.get("distinctAttribute")
        if (match is None) == (distinct is None):
            raise ManifestError(
                f"{where}: exactly one of matchAttribute or distinctAttribute must be set"
            )
        for value in (match, distinct):
            if value is not None and (not isinstance(value, str) or "/" not in value):
                raise ManifestError(f"{where}: {value!r} is not a fully qualified attribute name")
        return cls(
            requests=_strings(raw.get("requests"), f"{where}: requests"),
            match_attribute=match,
            distinct_attribute=distinct,
        )


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """``DeviceRequestAllocationResult``: one allocated device (one share of a shared one)."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: tuple[Toleration, ...] = ()
    share_id: str | None = None
    consumed_capacity: Mapping[str, Quantity] | None = None
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def device_id(self) -> DeviceID:
        return DeviceID(DriverName(self.driver), PoolName(self.pool), DeviceName(self.device))

    def renamed(
        self,
        request: str,
        driver: str,
        pool: str,
        device: str,
        consumed_capacity: Mapping[str, Quantity] | None,
    ) -> DeviceResult:
        """This result with these names and consumed capacities, every other field kept: what
        :func:`dataclasses.replace` gives, built without its walk over the fields and the
        frozen ``__init__`` (the controller keeps a copy of each result it decides whose
        strings and capacities are shared with equal ones)."""
        return _new_device_result(
            request,
            driver,
            pool,
            device,
            self.admin_access,
            self.tolerations,
            self.share_id,
            consumed_capacity,
            self.binding_conditions,
            self.binding_failure_conditions,
        )

    def consumed(self, capacity: str) -> Quantity | None:
        """What this share consumes of ``capacity`` (a name in the driver's domain, given
        unqualified or as ``<driver>/<name>``); ``None`` when the result does not say."""
        if self.consumed_capacity is None:
            return None
        found = self.consumed_capacity.get(capacity)
        if found is None:
            found = self.consumed_capacity.get(f"{self.driver}/{capacity}")
        return found

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> DeviceResult:
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: must be an object")
        try:
            consumed = raw.get("consumedCapacity")
            admin = raw.get("adminAccess")
            return cls(
                request=str(raw["request"]),
                driver=str(raw["driver"]),
                pool=str(raw["pool"]),
                device=str(raw["device"]),
                admin_access=bool(admin) if admin is not None else None,
                tolerations=tuple(
                    Toleration.from_api(t, f"{where}: tolerations[{i}]")
                    for i, t in enumerate(raw.get("tolerations") or ())
                ),
                share_id=str(raw["shareID"]) if raw.get("shareID") else None,
                consumed_capacity={str(k): Quantity.of(v) for k, v in consumed.items()}
                if consumed is not None
                else None,
                binding_conditions=_strings(raw.get("bindingConditions"), where),
                binding_failure_conditions=_strings(raw.get("bindingFailureConditions"), where),
            )
        except KeyError as exc:
            raise ManifestError(f"{where}: missing field {exc.args[0]!r}") from exc
        except (QuantityError, AttributeError, TypeError) as exc:
            raise ManifestError(f"{where}: malformed ({exc})") from exc

    def to_api(self) -> JSON:
        out: JSON = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.admin_access is not None:
            out["adminAccess"] = self.admin_access
        if self.tolerations:
            out["tolerations"] = [t.to_api() for t in self.tolerations]
        if self.binding_conditions:
            out["bindingConditions"] = list(self.binding_conditions)
        if self.binding_failure_conditions:
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.consumed_capacity is not None:
            out["consumedCapacity"] = {k: str(v) for k, v in sorted(self.consumed_capacity.items())}
        return out


#: :meth:`DeviceResult.renamed`'s builder (:mod:`driver.api.records`).
_new_device_result: Final = builder(DeviceResult)


@dataclass(frozen=True, slots=True)
class AllocationConfig:
    """``DeviceAllocationConfiguration``: where a config came from and which requests it is for
    (empty = all)."""

    source: ConfigSource
    requests: tuple[str, ...]
    opaque: OpaqueConfig

    def to_api(self) -> JSON:
        out: JSON = {"source": self.source}
        if self.requests:
            out["requests"] = list(self.requests)
        out.update(self.opaque.to_api())
        return out

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str) -> AllocationConfig:
        source = raw.get("source") if isinstance(raw, Mapping) else None
        if source not in ("FromClass", "FromClaim"):
            raise ManifestError(f"{where}: unknown config source {source!r}")
        return cls(
            source=source,
            requests=_strings(raw.get("requests"), f"{where}: requests"),
            opaque=OpaqueConfig.from_api(raw, where),
        )


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """``AllocationResult`` (``status.allocation``): devices, their config, where they are."""

    results: tuple[DeviceResult, ...]
    config: tuple[AllocationConfig, ...] = ()
    node_selector: JSON | None = None
    allocation_timestamp: str | None = None

    def results_of(self, driver: str) -> tuple[DeviceResult, ...]:
        """The results of one driver's devices, in allocation order."""
        return tuple(r for r in self.results if r.driver == driver)

    def to_api(self) -> JSON:
        """Exactly the v1 ``status.allocation`` object."""
        devices: JSON = {"results": [r.to_api() for r in self.results]}
        if self.config:
            devices["config"] = [c.to_api() for c in self.config]
        out: JSON = {"devices": devices}
        if self.node_selector is not None:
            out["nodeSelector"] = json_copy(self.node_selector)
        if self.allocation_timestamp:
            out["allocationTimestamp"] = self.allocation_timestamp
        return out

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], where: str = "allocation") -> AllocationResult:
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: must be an object")
        devices = raw.get("devices") or {}
        if not isinstance(devices, Mapping):
            raise ManifestError(f"{where}: devices must be an object")
        selector = raw.get("nodeSelector")
        if selector is not None and not isinstance(selector, Mapping):
            raise ManifestError(f"{where}: nodeSelector must be an object")
        return cls(
            results=tuple(
                DeviceResult.from_api(r, f"{where}: devices.results[{i}]")
                for i, r in enumerate(devices.get("results") or ())
            ),
            config=tuple(
                AllocationConfig.from_api(c, f"{where}: devices.config[{i}]")
                for i, c in enumerate(devices.get("config") or ())
            ),
            node_selector=json_copy(selector) if selector is not None else None,
            allocation_timestamp=raw.get("allocationTimestamp") or None,
        )


# --------------------------------------------------------------------------- claims


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """``ResourceClaimConsumerReference`` (an entry of ``status.reservedFor``)."""

    resource: str
    name: str
    uid: str
    api_group: str = ""

    def to_api(self) -> JSON:
        out: JSON = {"resource": self.resource, "name": self.name, "uid": self.uid}
        if self.api_group:
            out["apiGroup"] = self.api_group
        return out


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ``ResourceClaim``: its ``spec.devices`` and the parts of its status biaxial reads."""

    namespace: str
    name: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[ClaimConfig, ...] = ()
    allocation: AllocationResult | None = None
    reserved_for: tuple[ConsumerRef, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[JSON, ...] = ()
    deletion_timestamp: str | None = None
    resource_version: str = ""
    finalizers: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], specs: SpecMemo | None = None) -> ResourceClaim:
        """Parse a claim. With ``specs``, its ``spec.devices`` is parsed once per distinct
        value (claims made from one template repeat it): the claims then share the
        immutable request, constraint and config models; the result and any error are those
        of a parse without it."""
        if not isinstance(raw, Mapping):
            raise ManifestError("ResourceClaim: must be an object")
        where = _where("ResourceClaim", raw)
        meta = raw.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: metadata.name is required")
        spec = raw.get("spec") or {}
        devices = spec.get("devices") or {} if isinstance(spec, Mapping) else None
        if not isinstance(devices, Mapping):
            raise ManifestError(f"{where}: spec.devices must be an object")
        parsed = specs.get(devices) if specs is not None else None
        requests = parsed[0] if parsed is not None else _requests(devices, where)
        status = raw.get("status") or {}
        allocation = status.get("allocation")
        try:
            reserved = tuple(
                ConsumerRef(
                    resource=str(r["resource"]),
                    name=str(r["name"]),
                    uid=str(r["uid"]),
                    api_group=str(r.get("apiGroup") or ""),
                )
                for r in status.get("reservedFor") or ()
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"{where}: malformed status.reservedFor ({exc})") from exc
        if parsed is None:  # (in this order, so that errors come as they always did)
            parsed = (requests, *_constraints_and_config(devices, where))
            if specs is not None:
                specs.put(devices, parsed)
        _, constraints, config = parsed
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=name,
            uid=str(meta.get("uid") or ""),
            requests=requests,
            constraints=constraints,
            config=config,
            allocation=AllocationResult.from_api(allocation, f"{where}: status.allocation")
            if allocation
            else None,
            reserved_for=reserved,
            annotations=dict(meta.get("annotations") or {}),
            labels=dict(meta.get("labels") or {}),
            owner_references=tuple(json_copy(o) for o in meta.get("ownerReferences") or ()),
            deletion_timestamp=meta.get("deletionTimestamp") or None,
            resource_version=str(meta.get("resourceVersion") or ""),
            finalizers=tuple(meta.get("finalizers") or ()),
        )


_DevicesSpec = tuple[tuple[DeviceRequest, ...], tuple[Constraint, ...], tuple[ClaimConfig, ...]]


def _requests(devices: Mapping[str, Any], where: str) -> tuple[DeviceRequest, ...]:
    """``spec.devices.requests`` (``where`` names the claim in errors)."""
    requests = tuple(DeviceRequest.from_api(r, where) for r in devices.get("requests") or ())
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ManifestError(f"{where}: duplicate request names")
    return requests


def _constraints_and_config(
    devices: Mapping[str, Any], where: str
) -> tuple[tuple[Constraint, ...], tuple[ClaimConfig, ...]]:
    """``spec.devices.constraints`` and ``config`` (``where`` names the claim in errors)."""
    constraints = tuple(
        Constraint.from_api(c, f"{where}: constraints[{i}]")
        for i, c in enumerate(devices.get("constraints") or ())
    )
    config = tuple(
        ClaimConfig(
            requests=_strings(c.get("requests"), f"{where}: config[{i}].requests"),
            opaque=OpaqueConfig.from_api(c, f"{where}: config[{i}]"),
        )
        for i, c in enumerate(devices.get("config") or ())
    )
    return constraints, config


class SpecMemo:
    """The parsed ``spec.devices`` of claims, by value, for :meth:`ResourceClaim.from_api`.

    Keyed by the value's ``repr`` (equal JSON read from equal text has an equal ``repr``; a
    value with its keys in another order only misses) and checked against a private copy of
    the value with ``==``, so a hit always parses to what a fresh parse would give, whatever
    the caller does with its objects afterwards. A spec that does not parse is not kept (its
    error names the claim), nor one nested too deep for ``repr`` (the parse then refuses it
    with the message a parse without the memo gives, as it refuses opaque parameters nested
    deeper than it reads). At most :attr:`MAX` values are kept; then it starts afresh."""

    #: Distinct specs kept (a cluster has one per claim template or so).
    MAX: Final = 512

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, tuple[Any, _DevicesSpec]] = {}

    def get(self, devices: Mapping[str, Any]) -> _DevicesSpec | None:
        """The parsed spec kept for a value equal to ``devices``, or None."""
        try:
            found = self._kept.get(repr(devices))
        except RecursionError:
            return None  # (not kept: see the class docstring)
        if found is None or found[0] != devices:
            return None
        return found[1]

    def put(self, devices: Mapping[str, Any], parsed: _DevicesSpec) -> None:
        """Keep ``parsed``, the parse of ``devices``."""
        try:
            key = repr(devices)
        except RecursionError:
            return
        if len(self._kept) >= self.MAX:
            self._kept.clear()
        self._kept[key] = (json_copy(devices), parsed)


def classes_by_name(
    classes: Sequence[DeviceClass] | Mapping[str, DeviceClass],
) -> dict[str, DeviceClass]:
    """A name -> class mapping from either a sequence or a mapping (copied)."""
    if isinstance(classes, Mapping):
        return dict(classes)
    return {c.name: c for c in classes}
