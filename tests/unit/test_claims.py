"""DeviceClass / ResourceClaim / AllocationResult models: parsing, defaults, errors, round trip."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from driver.api.claims import (
    AllocationResult,
    DeviceClass,
    DeviceResult,
    ResourceClaim,
    SpecMemo,
    Toleration,
)
from driver.api.errors import ManifestError
from driver.api.model import DeviceTaint
from driver.api.quantity import Quantity
from tests.unit.builders import DRIVER, claim, device_class, sub, toleration


def test_device_class_from_api() -> None:
    raw = device_class(
        "gpu.biaxial.dev", config=[{"sharing": "mps"}], extended_resource_name="nvidia.com/gpu"
    )
    raw["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    before = copy.deepcopy(raw)
    cls = DeviceClass.from_api(raw)
    assert raw == before
    assert cls.name == "gpu.biaxial.dev"
    assert cls.selectors == (f'device.driver == "{DRIVER}"',)
    assert cls.config[0].driver == DRIVER
    assert cls.config[0].parameters == {"sharing": "mps"}
    assert cls.extended_resource_name == "nvidia.com/gpu"
    assert cls.creation_timestamp == "2026-01-01T00:00:00Z"
    # Parameters are a private copy.
    raw["spec"]["config"][0]["opaque"]["parameters"]["sharing"] = "changed"
    assert cls.config[0].parameters == {"sharing": "mps"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cls.name = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"metadata": {}}, "metadata.name is required"),
        ({"metadata": {"name": "c"}, "spec": {"selectors": [{}]}}, "no cel.expression"),
        ({"metadata": {"name": "c"}, "spec": {"config": [{}]}}, "without opaque"),
    ],
)
def test_device_class_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        DeviceClass.from_api(raw)


def test_claim_defaults_and_fields() -> None:
    raw = (
        claim("c0", namespace="ml")
        .request("a")
        .request("b", mode="All", admin=True, capacity={"memory": "1Gi"})
        .first_available("c", sub("x", count=2), sub("y", tolerations=[toleration("k", "Exists")]))
        .constraint(match=f"{DRIVER}/uuid", requests=["a", "c/x"])
        .config({"p": 1}, requests=["a"])
        .json()
    )
    before = copy.deepcopy(raw)
    c = ResourceClaim.from_api(raw)
    assert raw == before
    assert c.key == "ml/c0"
    a, b, cc = c.requests
    assert a.exactly is not None
    assert (a.exactly.allocation_mode, a.exactly.count, a.exactly.admin_access) == (
        "ExactCount",
        1,
        False,
    )
    assert b.exactly is not None
    assert (b.exactly.allocation_mode, b.exactly.count, b.exactly.admin_access) == ("All", 0, True)
    assert str(b.exactly.capacity_requests["memory"]) == "1Gi"
    assert cc.exactly is None
    assert [s.name for s in cc.first_available] == ["x", "y"]
    assert cc.first_available[0].count == 2
    assert cc.first_available[1].tolerations == (Toleration(key="k", operator="Exists"),)
    assert c.constraints[0].requests == ("a", "c/x")
    assert c.config[0].requests == ("a",)
    assert c.allocation is None


def _claim_with(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [request]}},
    }


@pytest.mark.parametrize(
    ("request_json", "message"),
    [
        ({"name": "r"}, "exactly one of exactly or firstAvailable"),
        (
            {"name": "r", "exactly": {"deviceClassName": "x"}, "firstAvailable": [{"name": "s"}]},
            "exactly one of exactly or firstAvailable",
        ),
        ({"name": "r", "exactly": {}}, "deviceClassName is required"),
        ({"name": "r", "exactly": {"deviceClassName": "x", "count": 0}}, "positive integer"),
        (
            {"name": "r", "exactly": {"deviceClassName": "x", "allocationMode": "Some"}},
            "unsupported allocationMode",
        ),
        (
            {"name": "r", "exactly": {"deviceClassName": "x", "allocationMode": "All", "count": 2}},
            "must not be set",
        ),
        (
            {
                "name": "r",
                "exactly": {"deviceClassName": "x", "capacity": {"requests": {"m": "x"}}},
            },
            "invalid quantity",
        ),
        (
            {"name": "r", "firstAvailable": [{"name": "s", "deviceClassName": "x"}] * 2},
            "duplicate subrequest names",
        ),
        (
            {"name": "r", "exactly": {"deviceClassName": "x", "tolerations": [{"operator": "Gt"}]}},
            "unknown toleration operator",
        ),
    ],
)
def test_claim_request_errors(request_json: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        ResourceClaim.from_api(_claim_with(request_json))


def test_claim_constraint_errors() -> None:
    raw = claim("c").request("r").json()
    raw["spec"]["devices"]["constraints"] = [{"matchAttribute": "a/b", "distinctAttribute": "a/c"}]
    with pytest.raises(ManifestError, match="exactly one of matchAttribute"):
        ResourceClaim.from_api(raw)
    raw["spec"]["devices"]["constraints"] = [{"matchAttribute": "unqualified"}]
    with pytest.raises(ManifestError, match="not a fully qualified"):
        ResourceClaim.from_api(raw)


def test_duplicate_request_names() -> None:
    raw = claim("c").request("r").request("r").json()
    with pytest.raises(ManifestError, match="duplicate request names"):
        ResourceClaim.from_api(raw)


def _template_claim(name: str) -> dict[str, Any]:
    return (
        claim(name)
        .request("a", capacity={"memory": "1Gi"})
        .first_available("c", sub("x", count=2), sub("y"))
        .constraint(match=f"{DRIVER}/uuid")
        .config({"p": [1, {"q": True}]}, requests=["a"])
        .json()
    )


def _outcome(raw: dict[str, Any], specs: SpecMemo | None) -> ResourceClaim | str:
    try:
        return ResourceClaim.from_api(raw, specs)
    except ManifestError as exc:
        return f"error: {exc}"


def test_spec_memo_parses_as_a_fresh_parse() -> None:
    """Claims from one template share their parsed spec; every answer, hit or miss, equals
    a parse without the memo, malformed claims included (never kept: the error names the
    claim), and a value changed by its owner afterwards does not change what is kept."""
    specs = SpecMemo()
    first = ResourceClaim.from_api(_template_claim("c0"), specs)
    second = ResourceClaim.from_api(_template_claim("c1"), specs)
    assert second == ResourceClaim.from_api(_template_claim("c1"))
    assert second.requests is first.requests
    assert second.config is first.config
    # The caller changes its object after the parse: the copy kept answers, not the object.
    raw = _template_claim("c2")
    parsed = ResourceClaim.from_api(raw, specs)
    raw["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    assert parsed.requests is first.requests
    assert _outcome(raw, specs) == _outcome(raw, None)
    cases: list[dict[str, Any]] = []
    for mutate in (
        lambda d: d["requests"][0]["exactly"].update(count=0),
        lambda d: d["requests"][0]["exactly"].update(count=True),  # == 1, another value
        lambda d: d["requests"][0]["exactly"].update(count=1.0),
        lambda d: d["requests"].append(dict(d["requests"][0])),  # duplicate names
        lambda d: d["constraints"][0].update(distinctAttribute="a/b"),
        lambda d: d["config"][0]["opaque"].update(parameters=[1]),
        lambda d: d.update(requests={"a": 1}),
    ):
        bad = _template_claim("bad")
        mutate(bad["spec"]["devices"])
        bad["status"] = {"reservedFor": [{"name": "no resource"}]}  # reported after requests
        cases += [bad, _template_claim("good")]
    for raw in cases * 2:
        assert _outcome(raw, specs) == _outcome(raw, None)


def test_spec_memo_refuses_a_spec_nested_too_deep_as_a_parse_without_it() -> None:
    """A claim whose opaque parameters nest thousands of levels deep (the API server accepts
    it) is refused with the parse's own message through the memo too: the memo's ``repr`` key
    cannot be built for it, so it is neither looked up nor kept (a CI run once saw the
    RecursionError of the key reach the pod as an internal error instead)."""
    deep: Any = 0
    for _ in range(5_000):
        deep = {"n": deep}
    raw = claim("deep").request("a").config({}, requests=["a"]).json()
    raw["spec"]["devices"]["config"][0]["opaque"]["parameters"] = deep
    specs = SpecMemo()
    for _ in range(2):
        outcome = _outcome(raw, specs)
        assert outcome == _outcome(raw, None)
        assert isinstance(outcome, str)
        assert "nest deeper than 64 levels" in outcome
    assert _outcome(_template_claim("c0"), specs) == _outcome(_template_claim("c0"), None)


FULL_ALLOCATION: dict[str, Any] = {
    "devices": {
        "results": [
            {
                "request": "r0/s",
                "driver": DRIVER,
                "pool": "node-0",
                "device": "gpu-0",
                "adminAccess": True,
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                "bindingConditions": ["Attached"],
                "bindingFailureConditions": ["Failed"],
                "shareID": "6d1f3c52-8a0e-5b7a-9f43-2c1b0e5d7a91",
                "consumedCapacity": {"cores": "30", "memory": "7500Mi"},
            }
        ],
        "config": [
            {
                "source": "FromClass",
                "requests": ["r0"],
                "opaque": {"driver": DRIVER, "parameters": {"a": [1, 2]}},
            },
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {}}},
        ],
    },
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}
        ]
    },
    "allocationTimestamp": "2026-01-01T00:00:00Z",
}


def test_allocation_round_trip() -> None:
    raw = copy.deepcopy(FULL_ALLOCATION)
    result = AllocationResult.from_api(raw)
    assert raw == FULL_ALLOCATION
    assert result.to_api() == FULL_ALLOCATION
    assert AllocationResult.from_api(result.to_api()) == result
    r = result.results[0]
    assert str(r.device_id) == f"{DRIVER}/node-0/gpu-0"
    assert str(r.consumed_capacity["memory"]) == "7500Mi"  # type: ignore[index]


def test_claim_with_status() -> None:
    raw = claim("c").request("r0").allocated(FULL_ALLOCATION).json()
    raw["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    c = ResourceClaim.from_api(raw)
    assert c.allocation is not None
    assert c.allocation.to_api() == FULL_ALLOCATION
    assert c.reserved_for[0].to_api() == {"resource": "pods", "name": "p", "uid": "u"}
    assert c.deletion_timestamp == "2026-01-01T00:00:00Z"


def test_allocation_result_errors() -> None:
    with pytest.raises(ManifestError, match="missing field 'device'"):
        AllocationResult.from_api(
            {"devices": {"results": [{"request": "r", "driver": "d", "pool": "p"}]}}
        )
    with pytest.raises(ManifestError, match="unknown config source"):
        AllocationResult.from_api({"devices": {"results": [], "config": [{"source": "Else"}]}})


@pytest.mark.parametrize(
    ("tol", "taint", "tolerated"),
    [
        (Toleration(key="k", operator="Exists"), DeviceTaint("k", "NoSchedule"), True),
        (Toleration(key="k", value="v"), DeviceTaint("k", "NoSchedule", "v"), True),
        (Toleration(key="k", value="v"), DeviceTaint("k", "NoSchedule", "w"), False),
        (Toleration(key="j", operator="Exists"), DeviceTaint("k", "NoSchedule"), False),
        (Toleration(operator="Exists"), DeviceTaint("k", "NoExecute"), True),
        (Toleration(operator="Exists", effect="NoSchedule"), DeviceTaint("k", "NoExecute"), False),
        (
            Toleration(key="k", operator="Exists", effect="NoExecute"),
            DeviceTaint("k", "NoExecute"),
            True,
        ),
    ],
)
def test_toleration_matrix(tol: Toleration, taint: DeviceTaint, tolerated: bool) -> None:
    assert tol.tolerates(taint) is tolerated


def test_a_renamed_result_is_what_replace_gives() -> None:
    """``DeviceResult.renamed`` builds without ``dataclasses.replace``: every other field is
    kept (each set apart from its default here). A field added to DeviceResult must be
    passed on by ``renamed`` too: the list below then fails until it is."""
    assert [f.name for f in dataclasses.fields(DeviceResult)] == [
        "request",
        "driver",
        "pool",
        "device",
        "admin_access",
        "tolerations",
        "share_id",
        "consumed_capacity",
        "binding_conditions",
        "binding_failure_conditions",
    ]
    result = DeviceResult.from_api(
        {
            "request": "r0",
            "driver": DRIVER,
            "pool": "p",
            "device": "gpu-0",
            "adminAccess": True,
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "shareID": "5a0c5ab4-2a3b-4bbb-9c1d-8c1f0e2f6f01",
            "consumedCapacity": {"memory": "8Gi"},
            "bindingConditions": ["ready"],
            "bindingFailureConditions": ["failed"],
        },
        "result",
    )
    capacity = {"memory": Quantity.of("8Gi")}
    renamed = result.renamed("r1", "other", "q", "gpu-1", capacity)
    assert renamed == dataclasses.replace(
        result, request="r1", driver="other", pool="q", device="gpu-1", consumed_capacity=capacity
    )
    assert renamed.consumed_capacity is capacity
    assert result.renamed("r0", DRIVER, "p", "gpu-0", result.consumed_capacity) == result
    with pytest.raises(dataclasses.FrozenInstanceError):
        renamed.device = "gpu-2"  # type: ignore[misc]
