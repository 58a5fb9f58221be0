"""GpuConfig opaque parameters: strict parsing (errors name the field) and resolution order."""

from __future__ import annotations

from typing import Any

import pytest

from driver.api.claims import AllocationConfig
from driver.api.config import GpuConfig, SharingConfig, parse_gpu_config, resolve_configs
from driver.api.errors import ConfigError, ManifestError

DRIVER = "gpu.biaxial.dev"
HEAD = {"apiVersion": "gpu.biaxial.dev/v1alpha1", "kind": "GpuConfig"}


def cfg(strategy: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {**HEAD, **extra}
    if strategy is not None:
        out["sharing"] = {"strategy": strategy}
    return out


def entry(
    params: Any,
    *,
    source: str = "FromClaim",
    requests: Any = None,
    driver: str = DRIVER,
) -> AllocationConfig:
    """One ``status.allocation.devices.config`` entry, read through the claim model."""
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        out["requests"] = requests
    return AllocationConfig.from_api(out, "allocation: devices.config[0]")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cfg("hami-core"), GpuConfig(SharingConfig("hami-core"))),
        (cfg("mps"), GpuConfig(SharingConfig("mps"))),
        (cfg("none"), GpuConfig(SharingConfig("none"))),
        (cfg(), GpuConfig(SharingConfig(None))),
    ],
)
def test_parse_valid(raw: dict[str, Any], expected: GpuConfig) -> None:
    assert parse_gpu_config(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            cfg("foo"),
            'sharing.strategy: unknown value "foo", expected one of "hami-core", "mps", "none"',
        ),
        (cfg("MPS"), 'sharing.strategy: unknown value "MPS"'),
        ({**HEAD, "sharing": {"strategy": 3}}, "sharing.strategy: expected a string, got int"),
        ({**HEAD, "sharing": {}}, "sharing.strategy: required"),
        ({**HEAD, "sharing": "mps"}, "sharing: expected an object, got str"),
        ({**HEAD, "sharing": {"strategy": "mps", "limit": 1}}, "sharing.limit: unknown field"),
        (cfg("mps", extra=1), "extra: unknown field"),
        (
            {**HEAD, "apiVersion": "gpu.biaxial.dev/v2"},
            'apiVersion: expected "gpu.biaxial.dev/v1alpha1"',
        ),
        ({"kind": "GpuConfig"}, "apiVersion: expected"),
        ({**HEAD, "kind": "MigConfig"}, "kind: expected \"GpuConfig\", got 'MigConfig'"),
        (["not", "an", "object"], "parameters: expected an object, got list"),
        (None, "parameters: expected an object, got NoneType"),
    ],
)
def test_parse_errors_name_the_field(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(raw)
    assert message in str(info.value)


def test_claim_config_overrides_class_config_whatever_the_list_order() -> None:
    configs = [
        entry(cfg("mps"), source="FromClaim", requests=["a"]),
        entry(cfg("hami-core"), source="FromClass"),
    ]
    resolved = resolve_configs(configs, DRIVER, ["a", "b"])
    assert resolved["a"].sharing.strategy == "mps"
    assert resolved["b"].sharing.strategy == "hami-core"


def test_later_claim_config_wins_and_parent_request_covers_subrequests() -> None:
    configs = [
        entry(cfg("none"), requests=[]),
        entry(cfg("mps"), requests=["gpu"]),
    ]
    resolved = resolve_configs(configs, DRIVER, ["gpu/small", "other"])
    assert resolved == {
        "gpu/small": GpuConfig(SharingConfig("mps")),
        "other": GpuConfig(SharingConfig("none")),
    }


def test_subrequest_named_exactly() -> None:
    configs = [entry(cfg("mps"), requests=["gpu/big"])]
    assert resolve_configs(configs, DRIVER, ["gpu/small"]) == {}
    assert resolve_configs(configs, DRIVER, ["gpu/big"])["gpu/big"].sharing.strategy == "mps"


def test_other_drivers_entries_are_ignored_even_if_invalid_for_us() -> None:
    configs = [entry({"whatever": True}, driver="other.example.com")]
    assert resolve_configs(configs, DRIVER, ["a"]) == {}


def test_invalid_entry_is_reported_even_if_it_applies_to_no_request() -> None:
    configs = [entry(cfg("foo"), requests=["unrelated"])]
    with pytest.raises(ConfigError) as info:
        resolve_configs(configs, DRIVER, ["a"])
    message = str(info.value)
    assert message.startswith("allocation.devices.config[0] (FromClaim) opaque.parameters: ")
    assert 'sharing.strategy: unknown value "foo"' in message


def test_malformed_requests_list_is_refused_by_the_claim_model() -> None:
    with pytest.raises(ManifestError, match=r"config\[0\]: requests: expected a list"):
        entry(cfg("mps"), requests="a")


def test_inputs_are_not_mutated() -> None:
    configs = [entry(cfg("mps"), source="FromClaim"), entry(cfg("none"), source="FromClass")]
    before = repr(configs)
    resolve_configs(configs, DRIVER, ["a"])
    assert repr(configs) == before
