"""``GpuConfig``: the driver's opaque configuration type, parsed, resolved and checked.

A DeviceClass (``spec.config``) or a claim (``spec.devices.config``) may carry opaque
parameters for a driver; the allocation copies them into ``status.allocation.devices.config``
(class entries first). Ours look like::

    apiVersion: gpu.biaxial.dev/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: hami-core        # hami-core | mps | none
      allowedStrategies: [hami-core, mps]   # DeviceClass only: the administrator's policy

Contract:

* :func:`parse_gpu_config` is strict: unknown fields, a wrong ``apiVersion`` / ``kind``, a
  value of the wrong type or an unknown strategy raise :class:`~driver.api.errors.ConfigError`
  whose message names the field (``sharing.strategy: unknown value "foo", expected one of
  "hami-core", "mps", "none"``). Another driver's parameters relabelled with our driver name
  are refused the same way (the first field we do not know is named).
* ``sharing.allowedStrategies`` is the administrator's sharing policy: only a DeviceClass's
  config may carry it (tenants cannot write DeviceClasses; in a claim it is refused), it must
  hold the entry's own ``strategy``, and it fixes which strategies the requests it applies to
  may end up with, whatever the claim's own config says.
* :func:`resolve_configs` gives the effective config per (sub)request of an allocation: entries
  apply in the order the API stores them with class entries first, so a claim entry overrides
  a class entry's ``strategy`` for the same request (an entry that names no strategy changes
  nothing). The policy of every class entry that applies is intersected; a resolved strategy
  outside it is a :class:`~driver.api.errors.ConfigError` naming the entry that chose it, so a
  claim cannot weaken the class's sharing. Only entries whose ``opaque.driver`` is ours are
  read; an empty ``requests`` list means "every request"; an entry naming ``req`` applies to
  its subrequests ``req/sub`` too. Every entry of ours is parsed, so a bad one is always
  reported.
* :func:`check_claim_config` is what the scheduler asks before it allocates anything: does the
  node accept this claim's configuration? It raises the error Prepare would raise for every
  refusal that depends only on the claim and its DeviceClasses: an entry of ours that does not
  parse (from any class a request may use, or from the claim itself), a strategy the class's
  ``allowedStrategies`` forbids, and the ``mps`` strategy on a request that asks for more than
  one device (one MPS daemon serves one GPU per
  container). Refusals that depend on the devices chosen (a sharing strategy on a MIG device)
  or on the node's settings (``hami-core`` without its library) remain Prepare's.
* Pure: no I/O, inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from driver.api.claims import (
    AllocationConfig,
    DeviceClass,
    OpaqueConfig,
    ResourceClaim,
)
from driver.api.errors import ConfigError

API_VERSION: Final = "gpu.biaxial.dev/v1alpha1"
KIND: Final = "GpuConfig"

SharingStrategy = Literal["hami-core", "mps", "none"]
STRATEGIES: Final[tuple[SharingStrategy, ...]] = get_args(SharingStrategy)


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """``sharing``: how a GPU handed to this request is shared and limited.

    ``strategy`` ``None`` means the node's default for the allocation (see ``docs/sharing.md``).
    ``allowed`` (``allowedStrategies``, DeviceClass only) ``None`` means no policy.
    """

    strategy: SharingStrategy | None = None
    allowed: tuple[SharingStrategy, ...] | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """One parsed ``GpuConfig`` object."""

    sharing: SharingConfig = SharingConfig()


_TOP_FIELDS: Final = frozenset({"apiVersion", "kind", "sharing"})
_SHARING_FIELDS: Final = frozenset({"strategy", "allowedStrategies"})


def _expected(values: Sequence[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _check_fields(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})"
        )


def _strategy(raw: object, where: str) -> SharingStrategy:
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: expected a string, got {type(raw).__name__}")
    for strategy in STRATEGIES:
        if strategy == raw:
            return strategy
    raise ConfigError(f'{where}: unknown value "{raw}", expected one of {_expected(STRATEGIES)}')


def _allowed(raw: object, where: str = "sharing.allowedStrategies") -> tuple[SharingStrategy, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list of strategies")
    allowed = tuple(_strategy(item, f"{where}[{i}]") for i, item in enumerate(raw))
    if len(set(allowed)) != len(allowed):
        raise ConfigError(f"{where}: lists a strategy twice")
    return tuple(s for s in STRATEGIES if s in allowed)


def parse_strategies(raw: object, where: str) -> tuple[SharingStrategy, ...]:
    """A non-empty list of distinct strategies (as ``allowedStrategies``), in canonical order;
    :class:`ConfigError` naming ``where`` otherwise."""
    return _allowed(raw, where)


def parse_gpu_config(raw: object) -> GpuConfig:
    """Parse the ``parameters`` of an opaque config entry into a :class:`GpuConfig`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"parameters: expected an object, got {type(raw).__name__}")
    _check_fields(raw, _TOP_FIELDS, "")
    api_version = raw.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(f'apiVersion: expected "{API_VERSION}", got {api_version!r}')
    kind = raw.get("kind")
    if kind != KIND:
        raise ConfigError(f'kind: expected "{KIND}", got {kind!r}')
    sharing_raw = raw.get("sharing")
    if sharing_raw is None:
        return GpuConfig()
    if not isinstance(sharing_raw, Mapping):
        raise ConfigError(f"sharing: expected an object, got {type(sharing_raw).__name__}")
    _check_fields(sharing_raw, _SHARING_FIELDS, "sharing")
    strategy_raw = sharing_raw.get("strategy")
    if strategy_raw is None:
        raise ConfigError(f"sharing.strategy: required, expected one of {_expected(STRATEGIES)}")
    strategy = _strategy(strategy_raw, "sharing.strategy")
    allowed: tuple[SharingStrategy, ...] | None = None
    if "allowedStrategies" in sharing_raw:
        allowed = _allowed(sharing_raw["allowedStrategies"])
        if strategy not in allowed:
            raise ConfigError(
                f'sharing.strategy: "{strategy}" is not in sharing.allowedStrategies '
                f"({_expected(allowed)})"
            )
    return GpuConfig(sharing=SharingConfig(strategy=strategy, allowed=allowed))


def parse_opaque(
    opaque: OpaqueConfig, driver: str, where: str, *, from_class: bool
) -> GpuConfig | None:
    """The :class:`GpuConfig` of one opaque entry, ``None`` when the entry is another driver's.

    A parse error is re-raised as ``<where> opaque.parameters: <field error>``, so every reader
    (Prepare, the scheduler) reports the field in the same words, prefixed by where it looks.
    ``from_class``: the entry is a DeviceClass's (the only place a sharing policy may be).
    """
    if opaque.driver != driver:
        return None
    try:
        parsed = parse_gpu_config(opaque.parameters)
    except ConfigError as exc:
        raise ConfigError(f"{where} opaque.parameters: {exc}") from exc
    if parsed.sharing.allowed is not None and not from_class:
        raise ConfigError(
            f"{where} opaque.parameters: sharing.allowedStrategies: only a DeviceClass's config "
            "may set the sharing policy; a claim chooses sharing.strategy within it"
        )
    return parsed


def _applies(entry_requests: Sequence[str], request: str) -> bool:
    if not entry_requests:
        return True
    base = request.split("/", 1)[0]
    return request in entry_requests or base in entry_requests


def allocation_location(index: int, entry: AllocationConfig) -> str:
    """Where Prepare says an allocation's config entry is: ``allocation.devices.config[i]
    (<source>)``."""
    return f"allocation.devices.config[{index}] ({entry.source})"


def policy_error(
    request: str, strategy: SharingStrategy, allowed: Sequence[SharingStrategy]
) -> str:
    """The refusal of a strategy outside the class's policy (the scheduler's and Prepare's
    words)."""
    return (
        f'sharing.strategy: "{strategy}" is not allowed for request {request!r} by the '
        f"DeviceClass's sharing policy (sharing.allowedStrategies: {_expected(allowed)})"
    )


def node_policy_error(
    strategy: SharingStrategy, node: str, allowed: Sequence[SharingStrategy]
) -> str:
    """The refusal of a share's strategy outside the node's sharing policy (the kubelet
    plugin's ``--share-strategies``), whatever the class allows."""
    return (
        f'sharing.strategy "{strategy}" is not allowed for a GPU share on node {node} by the '
        f"node's sharing policy (--share-strategies: {_expected(allowed)})"
    )


def resolve_configs(
    configs: Sequence[AllocationConfig],
    driver: str,
    requests: Sequence[str],
    *,
    locate: Callable[[int, AllocationConfig], str] = allocation_location,
) -> dict[str, GpuConfig]:
    """The effective :class:`GpuConfig` for each of ``requests`` (``req`` or ``req/sub``).

    ``configs`` is an allocation's ``devices.config``. Requests that no entry of ours applies
    to are absent from the result. A bad entry, or a strategy the policy forbids, raises
    :class:`ConfigError` located by ``locate(index, entry)`` (default
    ``allocation.devices.config[<index>] (<source>)``).
    """
    # Stable sort: FromClass before FromClaim, API order kept within each source.
    ordered = sorted(enumerate(configs), key=lambda item: item[1].source != "FromClass")
    strategy: dict[str, tuple[SharingStrategy | None, str]] = {}
    allowed: dict[str, tuple[SharingStrategy, ...]] = {}
    for index, entry in ordered:
        where = locate(index, entry)
        parsed = parse_opaque(entry.opaque, driver, where, from_class=entry.source == "FromClass")
        if parsed is None:
            continue
        sharing = parsed.sharing
        for request in requests:
            if not _applies(entry.requests, request):
                continue
            if sharing.strategy is not None or request not in strategy:
                strategy[request] = (sharing.strategy, where)
            if sharing.allowed is not None:
                before = allowed.get(request, STRATEGIES)
                allowed[request] = tuple(s for s in before if s in sharing.allowed)
    result: dict[str, GpuConfig] = {}
    for request, (chosen, where) in strategy.items():
        policy = allowed.get(request)
        if policy is not None and chosen is not None and chosen not in policy:
            raise ConfigError(f"{where} opaque.parameters: {policy_error(request, chosen, policy)}")
        result[request] = GpuConfig(SharingConfig(strategy=chosen, allowed=policy))
    return result


# --------------------------------------------------------------------------- the claim-level check


def mps_device_count_error(request: str, devices: int) -> str:
    """The refusal of ``mps`` for a request served by more than one GPU (Prepare's words)."""
    return (
        f"request {request!r}: sharing.strategy mps serves one GPU per container (one MPS pipe "
        f"directory), got {devices} GPUs; use hami-core or one request per GPU"
    )


def _scheduler_locations(
    where: str, class_name: str, class_entries: int
) -> Callable[[int, AllocationConfig], str]:
    """Locations of the entries the scheduler resolves: the class's entries first, then the
    claim's, in the words of ``check_claim_config``'s messages."""

    def locate(index: int, _: AllocationConfig) -> str:
        if index < class_entries:
            return f"{where} DeviceClass {class_name}: spec.config[{index}]"
        return f"{where} spec.devices.config[{index - class_entries}]"

    return locate


def check_claim_config(
    claim: ResourceClaim, classes: Mapping[str, DeviceClass], driver: str
) -> None:
    """Raise :class:`ConfigError` if the node would refuse this claim's configuration.

    For a claim still to be allocated, reads the config of every class the claim's requests
    (or their ``firstAvailable`` alternatives) may use and the claim's own
    ``spec.devices.config``; classes missing from ``classes`` are skipped (the caller reports
    them). For an allocated claim, reads the config its allocation carries, as Prepare does.
    Messages start with the claim and name the entry (``DeviceClass <name>: spec.config[<i>]``,
    ``spec.devices.config[<i>]`` or ``status.allocation.devices.config[<i>]``) and the field,
    in the words Prepare uses.
    """
    if claim.allocation is not None:
        # Allocated already (by anyone): the node reads the config the allocation carries.
        try:
            resolve_configs(claim.allocation.config, driver, ())
        except ConfigError as exc:
            raise ConfigError(f"claim {claim.key}: status.{exc}") from exc
        return
    used: dict[str, DeviceClass] = {}
    for request in claim.requests:
        alternatives = (
            (request.exactly,) if request.exactly is not None else request.first_available
        )
        for alt in alternatives:
            device_class = classes.get(alt.device_class_name)
            if device_class is not None:
                used.setdefault(device_class.name, device_class)
    if not any(o.driver == driver for c in used.values() for o in c.config) and not any(
        c.opaque.driver == driver for c in claim.config
    ):
        return
    where = f"claim {claim.key}:"
    for device_class in used.values():
        for i, opaque in enumerate(device_class.config):
            parse_opaque(
                opaque,
                driver,
                f"{where} DeviceClass {device_class.name}: spec.config[{i}]",
                from_class=True,
            )
    claim_entries = tuple(
        AllocationConfig(source="FromClaim", requests=c.requests, opaque=c.opaque)
        for c in claim.config
    )
    for i, entry in enumerate(claim_entries):
        parse_opaque(entry.opaque, driver, f"{where} spec.devices.config[{i}]", from_class=False)
    # What Prepare would resolve for each alternative the allocator may choose.
    for request in claim.requests:
        for name, alt in request.choices():
            device_class = classes.get(alt.device_class_name)
            class_entries = tuple(
                AllocationConfig(source="FromClass", requests=(name,), opaque=o)
                for o in (device_class.config if device_class is not None else ())
            )

            config = resolve_configs(
                (*class_entries, *claim_entries),
                driver,
                [name],
                locate=_scheduler_locations(where, alt.device_class_name, len(class_entries)),
            ).get(name)
            if (
                config is not None
                and config.sharing.strategy == "mps"
                and alt.allocation_mode == "ExactCount"
                and alt.count >= 2
            ):
                # Prepare names the container set, which is the base request.
                raise ConfigError(f"{where} {mps_device_count_error(request.name, alt.count)}")
