"""Readiness of a claim for binding (KEP-5007), after kube-scheduler's DynamicResources
``isClaimReadyForBinding``: only results with ``bindingConditions`` are looked at; their
``status.devices`` entry is matched by driver, pool and device (not the share ID); a missing
entry is not ready; a True failure condition fails; ready when every condition is True."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.binding import (
    BindingFailedError,
    BindingTimeoutError,
    BindingWaiter,
    binding_state,
    has_binding_conditions,
)

JSON = dict[str, Any]


def result(device: str, conditions: tuple[str, ...] = (), failures: tuple[str, ...] = ()) -> JSON:
    out: JSON = {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": "n", "device": device}
    if conditions:
        out["bindingConditions"] = list(conditions)
    if failures:
        out["bindingFailureConditions"] = list(failures)
    return out


def status_entry(device: str, share: str | None = None, **conditions: str) -> JSON:
    entry: JSON = {
        "driver": "gpu.biaxial.dev",
        "pool": "n",
        "device": device,
        "conditions": [{"type": t, "status": s} for t, s in conditions.items()],
    }
    if share:
        entry["shareID"] = share
    return entry


def claim(results: list[JSON], devices: list[JSON] | None = None) -> JSON:
    status: JSON = {"allocation": {"devices": {"results": results}}}
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "c"}, "status": status}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (claim([result("g0")]), True),  # nothing to wait for
        (claim([result("g0", ("Attached",))]), False),  # no status entry yet
        (claim([result("g0", ("Attached",))], [status_entry("g0", Attached="False")]), False),
        (claim([result("g0", ("Attached",))], [status_entry("g0", Attached="True")]), True),
        (claim([result("g0", ("A", "B"))], [status_entry("g0", A="True")]), False),
        (claim([result("g0", ("A",))], [status_entry("g1", A="True")]), False),
        # the share ID is not compared
        (claim([result("g0", ("A",))], [status_entry("g0", share="x", A="True")]), True),
        ({"status": {}}, False),  # not allocated
    ],
)
def test_ready_for_binding(case: JSON, expected: bool) -> None:
    assert binding_state(case) is expected


def test_a_true_failure_condition_fails_with_its_reason() -> None:
    failing = claim(
        [result("g0", ("Attached",), ("AttachFailed",))],
        [
            {
                **status_entry("g0"),
                "conditions": [
                    {"type": "AttachFailed", "status": "True", "reason": "NoFabric", "message": "x"}
                ],
            }
        ],
    )
    with pytest.raises(BindingFailedError, match=r"AttachFailed \(reason=NoFabric"):
        binding_state(failing)
    assert has_binding_conditions(failing["status"]["allocation"])
    assert not has_binding_conditions({"devices": {"results": [result("g0")]}})


def test_the_waiter_wakes_on_a_change_and_times_out() -> None:
    claims = {"ns/c": claim([result("g0", ("A",))])}

    async def scenario() -> None:
        waiter = BindingWaiter(claims.get, timeout_s=5.0)
        task = asyncio.create_task(waiter.wait(["ns/c"]))
        await asyncio.sleep(0.01)
        assert not task.done()
        claims["ns/c"] = claim([result("g0", ("A",))], [status_entry("g0", A="True")])
        waiter.changed("ns/c")
        assert await asyncio.wait_for(task, 1.0) < 5.0
        claims["ns/c"] = claim([result("g0", ("A",))])
        with pytest.raises(BindingTimeoutError, match=r"not met within 0\.05 s"):
            await BindingWaiter(claims.get, timeout_s=0.05).wait(["ns/c"])

    asyncio.run(scenario())
