"""Reconciliation of the checkpoint against the API: what is stale (a table), and the grace,
evidence and race rules of the loop, with an in-memory preparer, getter and clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from driver.api.errors import CheckpointError, ServerError
from kubeletplugin.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
from kubeletplugin.reconcile import Reconciler, Released, stale_reason

NODE = "node-a"
DRIVER = "gpu.biaxial.dev"


def record(uid: str = "uid-a", name: str = "a", state: str = "PrepareCompleted") -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace="team",
        name=name,
        state=state,  # type: ignore[arg-type]
        devices=(
            DeviceRecord(
                request_names=("gpu",),
                pool=NODE,
                device="gpu-0",
                cdi_device_ids=(),
                share_id=None,
                gpu_uuid="GPU-0",
                exclusive=True,
                memory_bytes=1,
                cores=100,
                strategy="none",
            ),
        ),
        cdi_spec_file=f"k8s.gpu.biaxial.dev-gpu_{uid}.json",
    )


def api_claim(
    uid: str = "uid-a",
    *,
    pool: str = NODE,
    driver: str = DRIVER,
    allocated: bool = True,
    reserved: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [{"request": "gpu", "driver": driver, "pool": pool, "device": "gpu-0"}]
            }
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": "a", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": status,
    }


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        (api_claim(), None),
        (None, "the claim no longer exists"),
        (api_claim("uid-new"), "the claim was deleted (its name now belongs to a claim with UID"),
        (api_claim(allocated=False), "the claim is no longer allocated"),
        (
            api_claim(pool="node-b"),
            "the claim is no longer allocated devices of gpu.biaxial.dev on node node-a",
        ),
        (
            api_claim(driver="other.example.com"),
            "the claim is no longer allocated devices of gpu.biaxial.dev",
        ),
        (api_claim(reserved=False), "the claim is reserved for no pod"),
        # A claim the model cannot read is not judged: only a clear answer frees devices.
        ({**api_claim(), "status": {"allocation": {"devices": {"results": [{}]}}}}, None),
    ],
    ids=[
        "in-use",
        "deleted",
        "recreated",
        "deallocated",
        "moved-to-another-node",
        "another-drivers-devices",
        "reserved-for-nothing",
        "unreadable",
    ],
)
def test_what_is_stale(claim: dict[str, Any] | None, reason: str | None) -> None:
    got = stale_reason(record(), claim, node_name=NODE, driver=DRIVER)
    if reason is None:
        assert got is None
    else:
        assert got is not None
        assert got.startswith(reason)


class FakePreparer:
    def __init__(self, *records: ClaimRecord) -> None:
        self.checkpoint = Checkpoint(boot_id="b", claims={r.uid: r for r in records})
        self.corrupt = False
        self.asked_since: dict[str, float] = {}  # uid -> time the kubelet asked for it
        self.released: list[tuple[str, str]] = []

    async def snapshot(self) -> Checkpoint:
        if self.corrupt:
            raise CheckpointError("checkpoint /x: checksum mismatch")
        return self.checkpoint

    async def release_stale(self, uid: str, reason: str, stale_since: float) -> ClaimRecord | None:
        found = self.checkpoint.claims.get(uid)
        if found is None or self.asked_since.get(uid, float("-inf")) >= stale_since:
            return None
        self.checkpoint = self.checkpoint.without_claim(uid)
        self.released.append((uid, reason))
        return found


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Api:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any] | None] = {}
        self.failing = False

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.failing:
            raise ServerError("503 from the API server", status=503)
        return self.claims.get(name)


def setup(*records: ClaimRecord) -> tuple[Reconciler, FakePreparer, Api, Clock]:
    preparer, api, clock = FakePreparer(*records), Api(), Clock()
    reconciler = Reconciler(
        preparer, api.get, node_name=NODE, driver_name=DRIVER, grace_s=300, clock=clock
    )
    return reconciler, preparer, api, clock


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_deleted_claim_is_released_after_the_grace_period_only() -> None:
    reconciler, preparer, api, clock = setup(record("uid-a", "a"), record("uid-b", "b"))
    api.claims = {"a": None, "b": api_claim("uid-b")}
    assert run(reconciler.run_once()) == []
    assert reconciler.suspects == {"uid-a": "the claim no longer exists"}
    clock.now += 299
    assert run(reconciler.run_once()) == []
    clock.now += 1
    (released,) = run(reconciler.run_once())
    assert released.record.uid == "uid-a"
    assert preparer.released == [("uid-a", "the claim no longer exists")]
    assert "uid-b" in preparer.checkpoint.claims
    assert reconciler.suspects == {}
    assert released.message() == (
        "claim team/a (uid-a) was prepared on this node but the claim no longer exists; "
        "unprepared without the kubelet's NodeUnprepareResources, freeing gpu-0"
    )


def test_a_claim_that_is_needed_again_starts_its_grace_over() -> None:
    reconciler, preparer, api, clock = setup(record())
    api.claims = {"a": api_claim(reserved=False)}  # between two pods of a shared claim
    run(reconciler.run_once())
    clock.now += 200
    api.claims = {"a": api_claim()}  # reserved again
    run(reconciler.run_once())
    assert reconciler.suspects == {}
    clock.now += 200
    api.claims = {"a": api_claim(reserved=False)}
    run(reconciler.run_once())
    clock.now += 200
    assert run(reconciler.run_once()) == []  # 200 s since it looked stale again
    assert preparer.released == []


def test_an_api_error_is_no_evidence_either_way() -> None:
    reconciler, _, api, clock = setup(record())
    api.claims = {"a": None}
    run(reconciler.run_once())
    api.failing = True
    clock.now += 1000
    assert run(reconciler.run_once()) == []  # unknown: neither released nor forgiven
    assert reconciler.suspects == {"uid-a": "the claim no longer exists"}
    api.failing = False
    assert [r.record.uid for r in run(reconciler.run_once())] == ["uid-a"]


def test_a_claim_the_kubelet_asked_for_since_it_looked_stale_is_kept() -> None:
    reconciler, preparer, api, clock = setup(record())
    api.claims = {"a": api_claim(allocated=False)}
    run(reconciler.run_once())
    preparer.asked_since["uid-a"] = clock.now + 10  # a Prepare call named it meanwhile
    clock.now += 400
    assert run(reconciler.run_once()) == []
    assert "uid-a" in preparer.checkpoint.claims
    assert reconciler.suspects == {}  # and its grace starts over


def test_prepares_in_flight_and_unreadable_checkpoints_are_left_alone() -> None:
    reconciler, preparer, api, _ = setup(record(state="PrepareStarted"))
    api.claims = {"a": None}
    run(reconciler.run_once())
    assert reconciler.suspects == {}  # the Preparer's recovery owns crashed Prepares
    preparer.corrupt = True
    assert run(reconciler.run_once()) == []


def test_a_claim_unprepared_meanwhile_is_forgotten() -> None:
    reconciler, preparer, api, _ = setup(record())
    api.claims = {"a": None}
    run(reconciler.run_once())
    preparer.checkpoint = preparer.checkpoint.without_claim("uid-a")  # the kubelet did it
    run(reconciler.run_once())
    assert reconciler.suspects == {}


def test_the_loop_reports_each_release() -> None:
    preparer, api = FakePreparer(record()), Api()
    api.claims = {"a": None}
    got: list[Released] = []
    reconciler = Reconciler(preparer, api.get, node_name=NODE, driver_name=DRIVER, grace_s=0)

    async def main() -> None:
        async def on_release(released: Released) -> None:
            got.append(released)

        task = asyncio.create_task(reconciler.run(0.01, on_release))
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert [r.record.uid for r in got] == ["uid-a"]
