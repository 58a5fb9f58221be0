"""Opaque ``GpuConfig`` parsing, validation and resolution per request.

A claim's ``status.allocation.devices.config`` carries opaque parameters for each driver. Ours
look like::

    apiVersion: gpu.biaxial.dev/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: hami-core        # hami-core | mps | none

Contract:

* :func:`parse_gpu_config` is strict: unknown fields, a wrong ``apiVersion`` / ``kind``, a
  value of the wrong type or an unknown strategy raise :class:`~driver.api.errors.ConfigError`
  whose message names the field (``sharing.strategy: unknown value "foo", expected one of
  "hami-core", "mps", "none"``).
* :func:`resolve_configs` applies the entries in the order the API stores them (class configs
  first, then claim configs), so a claim config overrides a class config for the same request.
  Only entries whose ``opaque.driver`` is ours are read; an empty ``requests`` list means
  "every request"; an entry naming ``req`` applies to its subrequests ``req/sub`` too.
* Pure: no I/O, inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from driver.api.errors import ConfigError

API_VERSION: Final = "gpu.biaxial.dev/v1alpha1"
KIND: Final = "GpuConfig"

SharingStrategy = Literal["hami-core", "mps", "none"]
STRATEGIES: Final[tuple[SharingStrategy, ...]] = get_args(SharingStrategy)


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """``sharing``: how a GPU handed to this request is shared and limited.

    ``strategy`` ``None`` means the node's default for the allocation (see ``docs/sharing.md``).
    """

    strategy: SharingStrategy | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """One parsed ``GpuConfig`` object."""

    sharing: SharingConfig = SharingConfig()


_TOP_FIELDS: Final = frozenset({"apiVersion", "kind", "sharing"})
_SHARING_FIELDS: Final = frozenset({"strategy"})


def _expected(values: Sequence[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _check_fields(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})"
        )


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
    if not isinstance(strategy_raw, str):
        raise ConfigError(f"sharing.strategy: expected a string, got {type(strategy_raw).__name__}")
    for strategy in STRATEGIES:
        if strategy == strategy_raw:
            return GpuConfig(sharing=SharingConfig(strategy=strategy))
    raise ConfigError(
        f'sharing.strategy: unknown value "{strategy_raw}", expected one of {_expected(STRATEGIES)}'
    )


def _applies(entry_requests: Sequence[str], request: str) -> bool:
    if not entry_requests:
        return True
    base = request.split("/", 1)[0]
    return request in entry_requests or base in entry_requests


def resolve_configs(
    configs: Sequence[Mapping[str, Any]], driver: str, requests: Sequence[str]
) -> dict[str, GpuConfig]:
    """The effective :class:`GpuConfig` for each of ``requests`` (``req`` or ``req/sub``).

    ``configs`` is ``status.allocation.devices.config`` as the API returns it. Requests that
    no entry of ours applies to are absent from the result. Each entry of ours is parsed even
    if it applies to no listed request, so a bad config is always reported.
    """
    if not isinstance(configs, Sequence):
        raise ConfigError("allocation.devices.config: expected a list")
    # Stable sort: FromClass before FromClaim, API order kept within each source.
    ordered = sorted(
        enumerate(configs),
        key=lambda item: (
            0 if isinstance(item[1], Mapping) and item[1].get("source") == "FromClass" else 1
        ),
    )
    result: dict[str, GpuConfig] = {}
    for index, entry in ordered:
        where = f"allocation.devices.config[{index}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        entry_requests = entry.get("requests") or []
        if not isinstance(entry_requests, list) or not all(
            isinstance(r, str) for r in entry_requests
        ):
            raise ConfigError(f"{where}.requests: expected a list of request names")
        try:
            parsed = parse_gpu_config(opaque.get("parameters"))
        except ConfigError as exc:
            source = entry.get("source", "")
            raise ConfigError(f"{where} ({source}) opaque.parameters: {exc}") from exc
        for request in requests:
            if _applies(entry_requests, request):
                result[request] = parsed
    return result
