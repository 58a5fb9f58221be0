"""GpuConfig opaque parameters: strict parsing (errors name the field), resolution order, and
the scheduler's check that refuses before allocation what Prepare would refuse after it."""

from __future__ import annotations

from typing import Any

import pytest

from driver.api.claims import AllocationConfig, DeviceClass
from driver.api.config import (
    GpuConfig,
    SharingConfig,
    check_claim_config,
    parse_gpu_config,
    resolve_configs,
)
from driver.api.errors import ConfigError, ManifestError
from tests.unit.builders import GPU_CLASS, claim, device_class, sub

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


# --------------------------------------------------------------------------- the scheduler's check

NVIDIA_GPU_CONFIG = {  # the NVIDIA DRA driver's GpuConfig, relabelled with our driver name
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}
EXPECTED = 'expected one of "hami-core", "mps", "none"'


def classes(*configs: dict[str, Any], name: str = GPU_CLASS) -> dict[str, DeviceClass]:
    return {name: DeviceClass.from_api(device_class(name, config=configs))}


@pytest.mark.parametrize(
    ("built", "class_configs", "message"),
    [
        (
            claim("c").request("gpu").config(cfg("bogus")),
            (),
            (
                "claim default/c: spec.devices.config[0] opaque.parameters: "
                f'sharing.strategy: unknown value "bogus", {EXPECTED}'
            ),
        ),
        (
            claim("c").request("gpu"),
            (cfg("bogus"),),
            (
                f"claim default/c: DeviceClass {GPU_CLASS}: spec.config[0] opaque.parameters: "
                f'sharing.strategy: unknown value "bogus", {EXPECTED}'
            ),
        ),
        (
            claim("c").request("gpu").config(NVIDIA_GPU_CONFIG),
            (),
            (
                "spec.devices.config[0] opaque.parameters: apiVersion: "
                "expected \"gpu.biaxial.dev/v1alpha1\", got 'resource.nvidia.com/v1beta1'"
            ),
        ),
        (
            claim("c").request("gpu").config({**NVIDIA_GPU_CONFIG, **HEAD}),
            (),
            "spec.devices.config[0] opaque.parameters: sharing.timeSlicingConfig: unknown field",
        ),
        (
            claim("c").request("gpu").config(cfg("mps"), requests=["gpu"]).config({"gpus": 2}),
            (),
            "spec.devices.config[1] opaque.parameters: gpus: unknown field",
        ),
        (
            claim("c").request("gpu", count=2).config(cfg("mps")),
            (),
            (
                "claim default/c: request 'gpu': sharing.strategy mps serves one GPU per container "
                "(one MPS pipe directory), got 2 GPUs; use hami-core or one request per GPU"
            ),
        ),
        (
            claim("c").request("gpu", count=3),
            (cfg("mps"),),
            "request 'gpu': sharing.strategy mps serves one GPU per container",
        ),
        (
            claim("c").first_available("gpu", sub("one"), sub("two", count=2)).config(cfg("mps")),
            (),
            (
                "request 'gpu': sharing.strategy mps serves one GPU per container "
                "(one MPS pipe directory), got 2 GPUs"
            ),
        ),
    ],
)
def test_the_scheduler_refuses_what_prepare_would_refuse(
    built: Any, class_configs: tuple[dict[str, Any], ...], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_claim_config(built.model(), classes(*class_configs), DRIVER)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("built", "class_configs"),
    [
        (claim("c").request("gpu", count=4), ()),
        (claim("c").request("gpu").config(cfg("mps")), ()),
        (claim("c").request("gpu", count=2).config(cfg("hami-core")), (cfg("mps"),)),
        (claim("c").request("gpu", count=2).config(cfg("mps"), requests=["other"]), ()),
        (claim("c").request("gpu", mode="All").config(cfg("mps")), ()),
        (claim("c").request("gpu").config({"anything": 1}, driver="other.example.com"), ()),
        (claim("c").request("gpu", cls="no-such-class"), (cfg("bogus"),)),
    ],
    ids=[
        "no-config",
        "mps-one-gpu",
        "claim-overrides-class",
        "mps-for-another-request",
        "all-mode-is-decided-at-prepare",
        "another-drivers-config",
        "unknown-class-is-the-callers",
    ],
)
def test_the_scheduler_accepts_what_prepare_accepts(
    built: Any, class_configs: tuple[dict[str, Any], ...]
) -> None:
    check_claim_config(built.model(), classes(*class_configs), DRIVER)


def test_an_allocated_claim_is_checked_by_the_config_its_allocation_carries() -> None:
    holding = claim("c").request("gpu").holding("gpu-0")
    # The class changed after the allocation: the node reads the copy in the allocation.
    check_claim_config(holding.model(), classes(cfg("bogus")), DRIVER)
    bad = (
        claim("c")
        .request("gpu")
        .allocated(
            {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"}
                    ],
                    "config": [
                        {
                            "source": "FromClass",
                            "opaque": {"driver": DRIVER, "parameters": cfg("x")},
                        }
                    ],
                }
            }
        )
    )
    with pytest.raises(ConfigError) as info:
        check_claim_config(bad.model(), classes(), DRIVER)
    assert str(info.value).startswith(
        "claim default/c: status.allocation.devices.config[0] (FromClass) opaque.parameters: "
        'sharing.strategy: unknown value "x"'
    )


def test_a_driver_name_flag_changes_whose_config_is_read() -> None:
    built = claim("c").request("gpu").config(cfg("bogus"), driver="gpu.example.org")
    check_claim_config(built.model(), classes(), DRIVER)
    with pytest.raises(ConfigError, match=r"sharing\.strategy: unknown value"):
        check_claim_config(built.model(), classes(), "gpu.example.org")


# --------------------------------------------------------------------------- the sharing policy

POLICY = cfg("hami-core")
POLICY["sharing"]["allowedStrategies"] = ["mps", "hami-core"]
FIXED = {**HEAD, "sharing": {"strategy": "hami-core", "allowedStrategies": ["hami-core"]}}


def test_the_policy_parses_in_canonical_order() -> None:
    assert parse_gpu_config(POLICY) == GpuConfig(SharingConfig("hami-core", ("hami-core", "mps")))


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        ([], "sharing.allowedStrategies: expected a non-empty list of strategies"),
        ("hami-core", "sharing.allowedStrategies: expected a non-empty list of strategies"),
        (["hami-core", "nvidia"], 'sharing.allowedStrategies[1]: unknown value "nvidia"'),
        (["hami-core", "hami-core"], "sharing.allowedStrategies: lists a strategy twice"),
        (["mps"], 'sharing.strategy: "hami-core" is not in sharing.allowedStrategies ("mps")'),
    ],
)
def test_a_bad_policy_names_the_field(allowed: object, message: str) -> None:
    raw = {**HEAD, "sharing": {"strategy": "hami-core", "allowedStrategies": allowed}}
    with pytest.raises(ConfigError) as info:
        parse_gpu_config(raw)
    assert message in str(info.value)


def test_a_claim_cannot_weaken_the_class_policy() -> None:
    """Measured before: a claim's own GpuConfig with strategy none on a 1 Gi share prepared
    with no limits, and nothing an administrator wrote could stop it."""
    configs = [entry(POLICY, source="FromClass"), entry(cfg("none"), requests=["gpu"])]
    with pytest.raises(ConfigError) as info:
        resolve_configs(configs, DRIVER, ["gpu", "other"])
    assert str(info.value) == (
        "allocation.devices.config[1] (FromClaim) opaque.parameters: sharing.strategy: "
        "\"none\" is not allowed for request 'gpu' by the DeviceClass's sharing policy "
        '(sharing.allowedStrategies: "hami-core", "mps")'
    )


def test_a_claim_chooses_within_the_policy_and_cannot_unset_the_class_strategy() -> None:
    configs = [
        entry(POLICY, source="FromClass"),
        entry(cfg("mps"), requests=["a"]),
        entry(cfg(), requests=["b"]),  # names no strategy: the class's stays
    ]
    resolved = resolve_configs(configs, DRIVER, ["a", "b"])
    assert resolved == {
        "a": GpuConfig(SharingConfig("mps", ("hami-core", "mps"))),
        "b": GpuConfig(SharingConfig("hami-core", ("hami-core", "mps"))),
    }


def test_class_policies_intersect() -> None:
    configs = [entry(POLICY, source="FromClass"), entry(FIXED, source="FromClass")]
    resolved = resolve_configs(configs, DRIVER, ["gpu"])
    assert resolved["gpu"] == GpuConfig(SharingConfig("hami-core", ("hami-core",)))
    with pytest.raises(ConfigError, match='"mps" is not allowed'):
        resolve_configs([*configs, entry(cfg("mps"))], DRIVER, ["gpu"])


def test_only_a_device_class_may_carry_the_policy() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_configs([entry(POLICY)], DRIVER, ["gpu"])
    assert "sharing.allowedStrategies: only a DeviceClass's config may set the sharing" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("built", "message"),
    [
        (
            claim("c").request("gpu").config(cfg("none")),
            (
                "claim default/c: spec.devices.config[0] opaque.parameters: sharing.strategy: "
                "\"none\" is not allowed for request 'gpu' by the DeviceClass's sharing policy "
                '(sharing.allowedStrategies: "hami-core")'
            ),
        ),
        (
            claim("c").first_available("gpu", sub("one")).config(cfg("mps"), requests=["gpu"]),
            "\"mps\" is not allowed for request 'gpu/one'",
        ),
        (
            claim("c").request("gpu").config(FIXED),
            "spec.devices.config[0] opaque.parameters: sharing.allowedStrategies: only a",
        ),
    ],
    ids=["none-on-a-fixed-class", "subrequest", "a-claim-policy"],
)
def test_the_scheduler_refuses_a_weakened_policy(built: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_claim_config(built.model(), classes(FIXED), DRIVER)
    assert message in str(info.value)


def test_a_class_with_a_policy_it_breaks_itself_is_reported_at_the_class() -> None:
    broken = {**HEAD, "sharing": {"strategy": "none", "allowedStrategies": ["mps"]}}
    with pytest.raises(ConfigError) as info:
        check_claim_config(claim("c").request("gpu").model(), classes(broken), DRIVER)
    assert str(info.value).startswith(
        f"claim default/c: DeviceClass {GPU_CLASS}: spec.config[0] opaque.parameters: "
        'sharing.strategy: "none" is not in sharing.allowedStrategies'
    )
    check_claim_config(
        claim("c").request("gpu").config(cfg("hami-core")).model(), classes(FIXED), DRIVER
    )
