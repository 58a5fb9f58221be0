"""Prepare creates, Unprepare destroys: dynamic MIG through the Preparer, against the fake NVML
backend (instances, conflicts, injected failures), real files and an in-memory API.

Every test checks the same invariant at the end: the instances that exist are exactly the ones
prepared claims record, plus the foreign ones, which are never touched."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import ApiError
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend
from driver.discovery.gpus import MigInfo
from driver.discovery.mig import DynamicMigPolicy
from kubeletplugin.checkpoint import CheckpointStore
from kubeletplugin.prepare import ClaimRef, Preparer
from kubeletplugin.reconcile import Reconciler
from tests.integration.test_prepare import Node, env, gpu_config, result

DRIVER = "gpu.biaxial.dev"
NODE = "gpu-t4"  # the pool name result() uses


class Crash(BaseException):
    """The process dies here."""


class DynamicNode(Node):
    """Two dynamic-MIG A100-80GB GPUs whose NVML state lives in a file (it outlives a
    Preparer, as NVML's outlives a plugin process)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.state = root / "nvml.json"
        self.backend = self.nvml()
        self.changes = 0

    def nvml(self) -> FakeBackend:
        return FakeBackend.from_profile("a100-80gbx8-dynmig", node_name=NODE, state_file=self.state)

    def gpu(self, index: int = 0) -> str:
        return self.backend.discover()[index].uuid

    def instances(self, index: int = 0) -> list[MigInfo]:
        return list(self.nvml().discover()[index].mig_devices)

    def preparer(self, boot_id: str = "boot-1", **overrides: Any) -> Preparer:
        """A plugin (re)start: a fresh backend object on the same NVML state."""
        self.backend = self.nvml()
        gpus = self.backend.discover()[:2]
        policy = DynamicMigPolicy(gpus=self.backend.dynamic_mig)
        owned = CheckpointStore(self.settings.state_dir).load().owned_instances()

        def changed() -> None:
            self.changes += 1

        return Preparer(
            dataclasses.replace(self.settings, **overrides),
            DeviceTable.from_gpus(gpus, policy, owned),
            self.api.get,
            boot_id=boot_id,
            mig=self.backend,
            on_mig_change=changed,
        )

    def recorded(self) -> set[str]:
        checkpoint = CheckpointStore(self.settings.state_dir).load()
        return {m.uuid for m in checkpoint.mig_records() if m.uuid}


@pytest.fixture
def node(tmp_path: Path) -> DynamicNode:
    return DynamicNode(tmp_path)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def no_leaks(node: DynamicNode, foreign: frozenset[str] = frozenset()) -> None:
    live = {m.uuid for i in (0, 1) for m in node.instances(i)}
    assert live == node.recorded() | set(foreign)


# --------------------------------------------------------------------------- create / destroy


def test_prepare_creates_the_instance_and_unprepare_destroys_it(node: DynamicNode) -> None:
    ref = node.api.add("notebook", [result("gpu-0-mig-3g40gb-4")])
    preparer = node.preparer()
    out = run(preparer.prepare([ref]))
    assert out[ref.uid].error == ""
    (made,) = node.instances()
    assert (made.profile, made.start) == ("3g.40gb", 4)
    spec = node.spec(ref)
    assert env(spec)["NVIDIA_VISIBLE_DEVICES"] == made.uuid
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        *({"path": cap} for cap in made.caps),
    ]
    assert preparer.owned_instances() == {(node.gpu(), "3g.40gb", 4)}
    assert node.changes == 1  # the plugin re-discovers to see the new instance
    no_leaks(node)
    # Prepare again (kubelet restart): the same answer, nothing new created.
    assert run(preparer.prepare([ref])) == out
    assert len(node.instances()) == 1
    assert run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert node.instances() == []
    assert not node.spec_exists(ref)
    assert preparer.owned_instances() == frozenset()
    no_leaks(node)


def test_shares_of_a_dynamic_gpu_share_its_full_size_instance(node: DynamicNode) -> None:
    a = node.api.add("a", [result("gpu-1", memory_mib=8000)])
    b = node.api.add("b", [result("gpu-1", memory_mib=8000)])
    preparer = node.preparer()
    out = run(preparer.prepare([a, b]))
    assert out[a.uid].error == out[b.uid].error == ""
    (full,) = node.instances(1)
    assert (full.profile, full.start) == ("7g.80gb", 0)
    assert env(node.spec(a))["NVIDIA_VISIBLE_DEVICES"] == full.uuid
    assert env(node.spec(b))["NVIDIA_VISIBLE_DEVICES"] == full.uuid
    assert "LD_PRELOAD" not in env(node.spec(a))  # time-sliced: hami-core cannot run on MIG
    run(preparer.unprepare([a]))
    assert node.instances(1) == [full]  # b still uses it
    run(preparer.unprepare([b]))
    assert node.instances(1) == []


def test_hami_core_on_a_dynamic_gpu_is_refused_with_the_way_out(node: DynamicNode) -> None:
    ref = node.api.add("h", [result("gpu-0", memory_mib=4000)], config=[gpu_config("hami-core")])
    error = run(node.preparer().prepare([ref]))[ref.uid].error
    assert "sharing.strategy hami-core is not supported on MIG devices" in error
    assert "use sharing.strategy none" in error
    assert node.instances() == []  # refused before anything was created


def test_an_overlapping_placement_for_another_claim_is_refused(
    node: DynamicNode, caplog: pytest.LogCaptureFixture
) -> None:
    held = node.api.add("held", [result("gpu-0-mig-4g40gb-0")])
    overlapping = node.api.add("late", [result("gpu-0-mig-2g20gb-2")])
    whole = node.api.add("whole", [result("gpu-0")])
    beside = node.api.add("beside", [result("gpu-0-mig-3g40gb-4")])
    preparer = node.preparer()
    assert run(preparer.prepare([held]))[held.uid].error == ""
    with caplog.at_level(logging.WARNING, logger="biaxial.kubeletplugin.prepare"):
        out = run(preparer.prepare([overlapping, whole, beside]))
    assert (
        "device gpu-0-mig-2g20gb-2 overlaps gpu-0-mig-4g40gb-0 on the same GPU, which is "
        "prepared for another claim" in out[overlapping.uid].error
    )
    assert "held" not in out[overlapping.uid].error  # another tenant's claim: the log only
    assert "(held by claim default/held (uid-held))" in caplog.text
    assert "overlaps gpu-0-mig-4g40gb-0" in out[whole.uid].error
    assert out[beside.uid].error == ""
    assert len(node.instances()) == 2
    no_leaks(node)


def test_one_plus_me_instance_per_gpu_is_all_the_engines_allow(node: DynamicNode) -> None:
    first = node.api.add("me1", [result("gpu-0-mig-1g10gbme-0")])
    second = node.api.add("me2", [result("gpu-0-mig-1g10gbme-1")])
    preparer = node.preparer()
    assert run(preparer.prepare([first]))[first.uid].error == ""
    assert "overlaps gpu-0-mig-1g10gbme-0" in run(preparer.prepare([second]))[second.uid].error


# --------------------------------------------------------------------------- failures and crashes


def test_a_failed_creation_fails_the_claim_and_leaves_nothing(node: DynamicNode) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-1g10gb-6"), result("gpu-1-mig-1g10gb-6", "r1")])
    preparer = node.preparer()
    backend = node.backend

    def fail_the_next(_: MigInfo) -> None:
        backend.after_create = None
        backend.fail_next("create", "insufficient resources")

    # The first instance is created, the second fails: the first is destroyed again.
    backend.after_create = fail_the_next
    out = run(preparer.prepare([ref]))
    assert "NVML failed to create 1g.10gb at 6" in out[ref.uid].error
    assert node.instances(0) == node.instances(1) == []
    assert CheckpointStore(node.settings.state_dir).load().claims == {}
    assert run(preparer.prepare([ref]))[ref.uid].error == ""  # the kubelet's retry works
    no_leaks(node)


def test_a_placement_taken_by_a_foreign_instance_meanwhile_is_a_clear_error(
    node: DynamicNode,
) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-1g10gb-5")])
    preparer = node.preparer()  # its table was made before the foreign instance appeared
    foreign = node.backend.create_mig(node.gpu(), "2g.20gb", 4)
    error = run(preparer.prepare([ref]))[ref.uid].error
    assert "placement 5+1 of 1g.10gb is taken by instance" in error
    assert node.instances() == [foreign]


def test_a_crash_between_creation_and_checkpoint_converges_without_a_leak(
    node: DynamicNode,
) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-2g20gb-2")])
    preparer = node.preparer()

    def die(_: MigInfo) -> None:
        raise Crash

    node.backend.after_create = die
    with pytest.raises(Crash):
        run(preparer.prepare([ref]))
    (orphan,) = node.instances()  # NVML made it; the checkpoint only has the intent
    record = CheckpointStore(node.settings.state_dir).load().claims[ref.uid]
    assert record.state == "PrepareStarted"
    assert [(m.profile, m.start, m.uuid) for m in record.mig] == [("2g.20gb", 2, "")]
    restarted = node.preparer()
    run(restarted.recover())
    assert node.instances() == []  # found at the intent's placement and destroyed
    assert CheckpointStore(node.settings.state_dir).load().claims == {}
    out = run(restarted.prepare([ref]))  # the kubelet retries
    assert out[ref.uid].error == ""
    assert [m.uuid for m in node.instances()] != [orphan.uuid]
    no_leaks(node)


def test_a_destroy_that_fails_keeps_the_record_until_it_succeeds(node: DynamicNode) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-1g10gb-6")])
    preparer = node.preparer()
    run(preparer.prepare([ref]))
    for reason in ("in use", "still in use", "in use again"):
        node.backend.fail_next("destroy", reason)
    error = run(preparer.unprepare([ref]))[ref.uid]
    assert "cannot destroy its MIG instance(s) yet" in error
    assert "in use" in error
    assert len(node.instances()) == 1
    no_leaks(node)  # still recorded, so still biaxial's to destroy
    # The next call retries (and fails once more): the placement stays taken meanwhile.
    other = node.api.add("o", [result("gpu-0-mig-7g80gb-0")])
    assert "overlaps gpu-0-mig-1g10gb-6" in run(preparer.prepare([other]))[other.uid].error
    (stuck,) = node.instances()
    retried = run(preparer.prepare([ref]))[ref.uid].error
    assert "an earlier attempt left MIG instance(s) that could not be destroyed yet" in retried
    # This call's recovery destroys it at last; then the claim is prepared anew.
    assert run(preparer.prepare([ref]))[ref.uid].error == ""
    assert [m.uuid for m in node.instances()] != [stuck.uuid]
    assert run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert node.instances() == []


# --------------------------------------------------------------------------- restarts


def test_a_restart_recreates_missing_instances_of_prepared_claims(node: DynamicNode) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-4g40gb-0")])
    first = run(node.preparer().prepare([ref]))
    (before,) = node.instances()
    node.backend.reset_instances()  # a GPU reset (or a reboot) took every instance away
    assert node.instances() == []
    restarted = node.preparer()
    run(restarted.recover())
    (after,) = node.instances()
    assert (after.profile, after.start) == ("4g.40gb", 0)
    assert after.uuid != before.uuid
    # The container is given the new instance; the kubelet keeps its CDI device IDs.
    assert env(node.spec(ref))["NVIDIA_VISIBLE_DEVICES"] == after.uuid
    assert run(restarted.prepare([ref])) == first
    no_leaks(node)


def test_a_reboot_recreates_them_too(node: DynamicNode) -> None:
    ref = node.api.add("c", [result("gpu-1-mig-1g10gb-3")])
    run(node.preparer(boot_id="boot-1").prepare([ref]))
    node.state.unlink()  # the reboot: NVML starts with no instance
    shutil.rmtree(node.settings.cdi_dir)
    rebooted = node.preparer(boot_id="boot-2")
    run(rebooted.recover())
    (made,) = node.instances(1)
    assert env(node.spec(ref))["NVIDIA_VISIBLE_DEVICES"] == made.uuid


def reserve(node: DynamicNode, *refs: ClaimRef) -> None:
    """The claims are in use by a pod, as the API would say."""
    for ref in refs:
        status = node.api.claims[(ref.namespace, ref.name)]["status"]
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]


def test_reconciliation_destroys_the_instances_of_claims_gone_from_the_api(
    node: DynamicNode,
) -> None:
    kept = node.api.add("kept", [result("gpu-0-mig-1g10gb-6")])
    gone = node.api.add("gone", [result("gpu-0-mig-1g10gb-5")])
    recreated = node.api.add("recreated", [result("gpu-1-mig-1g10gb-6")])
    reserve(node, kept, gone, recreated)
    preparer = node.preparer()
    run(preparer.prepare([kept, gone, recreated]))
    del node.api.claims[("default", "gone")]
    node.api.claims[("default", "recreated")]["metadata"]["uid"] = "uid-new"
    reconciler = Reconciler(preparer, node.api.get, node_name=NODE, driver_name=DRIVER, grace_s=0)
    released = run(reconciler.run_once())
    assert sorted(r.record.uid for r in released) == [gone.uid, recreated.uid]
    assert [(m.profile, m.start) for m in node.instances(0)] == [("1g.10gb", 6)]
    assert node.instances(1) == []
    assert set(CheckpointStore(node.settings.state_dir).load().claims) == {kept.uid}
    assert not node.spec_exists(gone)
    no_leaks(node)


def test_a_release_that_cannot_destroy_yet_is_retried_at_the_next_call(
    node: DynamicNode,
) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-1g10gb-6")])
    preparer = node.preparer()
    run(preparer.prepare([ref]))
    del node.api.claims[("default", "c")]
    node.backend.fail_next("destroy", "In use by another client")
    reconciler = Reconciler(preparer, node.api.get, node_name=NODE, driver_name=DRIVER, grace_s=0)
    (released,) = run(reconciler.run_once())
    assert released.record.uid == ref.uid
    assert len(node.instances()) == 1  # still recorded: the next load destroys it
    assert not node.spec_exists(ref)
    run(preparer.snapshot())
    assert node.instances() == []
    assert CheckpointStore(node.settings.state_dir).load().claims == {}


def test_an_unreachable_api_proves_nothing_gone(node: DynamicNode) -> None:
    ref = node.api.add("c", [result("gpu-0-mig-1g10gb-6")])
    preparer = node.preparer()
    run(preparer.prepare([ref]))

    async def unreachable(namespace: str, name: str) -> None:
        raise ApiError(f"GET {namespace}/{name}: service unavailable", status=503)

    reconciler = Reconciler(preparer, unreachable, node_name=NODE, driver_name=DRIVER, grace_s=0)
    assert run(reconciler.run_once()) == []
    run(node.preparer().recover())
    assert len(node.instances()) == 1


def test_foreign_instances_are_never_touched(node: DynamicNode) -> None:
    foreign = node.backend.create_mig(node.gpu(), "3g.40gb", 0)  # an administrator's
    ref = node.api.add("c", [result("gpu-0-mig-3g40gb-4")])
    preparer = node.preparer()
    devices = DeviceTable.from_gpus(
        node.backend.discover()[:2],
        DynamicMigPolicy(gpus=node.backend.dynamic_mig),
        preparer.owned_instances(),
    )
    # Its placements are unavailable: not published, so never allocated or prepared.
    assert devices.published_device("gpu-0-mig-3g40gb-0") is None
    assert devices.published_device("gpu-0") is None
    preparer.observe_inventory(devices)
    assert run(preparer.prepare([ref]))[ref.uid].error == ""
    crashed = node.api.add("x", [result("gpu-1-mig-1g10gb-6")])
    node.backend.after_create = lambda _: (_ for _ in ()).throw(Crash)
    with pytest.raises(Crash):
        run(preparer.prepare([crashed]))
    run(node.preparer().recover())  # the crashed one's instance goes, the foreign stays
    assert node.instances(1) == []
    run(node.preparer().unprepare([ref]))
    assert node.instances() == [foreign]
    no_leaks(node, frozenset({foreign.uuid}))
