"""Prepare's conflict rules: may a planned claim join the claims already prepared on this node?

Contract (pure; :func:`find_conflict` returns the first reason, or ``None``):

* A device prepared for another claim is refused, unless both are shares of a shareable GPU
  and the summed ``consumedCapacity`` of every share stays within its memory and cores (and,
  with a node share cap, the number of shares within it).
* A full GPU is refused while one of its MIG partitions is prepared, and the reverse;
  distinct MIG partitions never overlap.
* Dynamic-MIG devices of one GPU prepared together must fit the GPU's MIG resources (each
  device counted once, however many shares it has).
* Admin-access devices are exempt in both directions, as upstream's allocator exempts them.
* The message is for the claim's owner and names only the claim's own objects; the holder
  (another tenant's claim) is returned apart, for the node's log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from driver.api.errors import PrepareError
from driver.discovery.devices import DeviceTable, NodeDevice
from driver.discovery.mig import MigGeometry
from kubeletplugin.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
from kubeletplugin.planning import ClaimPlan
from kubeletplugin.sharing.base import FULL_CORES


def _physical(device: str, devices: DeviceTable) -> str:
    known = devices.get(device)
    return device if known is None else known.physical_uuid


def _is_mig(device: str, devices: DeviceTable) -> bool:
    known = devices.get(device)
    return known is not None and known.is_mig


@dataclass(frozen=True, slots=True)
class Conflict:
    """Why a plan cannot be prepared next to the claims already prepared. ``message`` is for
    the claim's owner and names only the claim's own objects; ``holder`` (another tenant's
    claim, when one is in the way) is for the node's log."""

    message: str
    holder: ClaimRecord | None = None


def find_conflict(
    plan: ClaimPlan,
    checkpoint: Checkpoint,
    devices: DeviceTable,
    max_shares: int | None = None,
) -> Conflict | None:
    """The first reason ``plan`` cannot join the claims held in ``checkpoint`` (any state), or
    ``None``. ``devices`` is the table the plan was made with; ``max_shares`` the node's share
    cap (at most that many shares of one GPU are prepared, as the published ``shares``
    capacity allows). Pure.

    Admin access (upstream's ``adminAccess``: "ignore all ordinary claims to the device") is
    never blocked and never blocks: an admin-access device of either side is skipped, and
    admin-access shares count towards no capacity.
    """
    others = [
        (rec, dev)
        for rec in checkpoint.claims.values()
        if rec.uid != plan.ref.uid
        for dev in rec.devices
        if not dev.admin_access
    ]
    return (
        _device_conflict(plan, others, devices)
        or _dynamic_conflict(plan, others, devices)
        or _capacity_conflict(plan, others, devices, max_shares)
    )


def _device_conflict(
    plan: ClaimPlan, others: Sequence[tuple[ClaimRecord, DeviceRecord]], devices: DeviceTable
) -> Conflict | None:
    """A device of the plan held by another claim (unless both are shares), or a full GPU
    beside a MIG partition of it."""
    for mine in plan.devices:
        if mine.admin_access:
            continue
        physical = _physical(mine.device, devices)
        for rec, dev in others:
            if dev.device == mine.device:
                if dev.exclusive or mine.exclusive:
                    return Conflict(
                        f"claim {plan.ref}: device {mine.device} is already prepared for "
                        "another claim"
                        + (
                            ""
                            if dev.exclusive
                            else " as a share; an exclusive allocation cannot join it"
                        ),
                        rec,
                    )
            elif _physical(dev.device, devices) == physical and not (
                _is_mig(mine.device, devices) and _is_mig(dev.device, devices)
            ):
                # A full GPU and a MIG partition of it; distinct MIG partitions never overlap.
                return Conflict(
                    f"claim {plan.ref}: device {mine.device} overlaps {dev.device} on the same "
                    "GPU, which is prepared for another claim",
                    rec,
                )
    return None


def _capacity_conflict(
    plan: ClaimPlan,
    others: Sequence[tuple[ClaimRecord, DeviceRecord]],
    devices: DeviceTable,
    max_shares: int | None,
) -> Conflict | None:
    """Capacity of each shared device: every prepared share plus this claim's."""
    for device in sorted(
        {d.device for d in plan.devices if not d.exclusive and not d.admin_access}
    ):
        target = devices.get(device)
        if target is None:  # the plan was made with another table: plan again
            return Conflict(f"claim {plan.ref}: device {device} is not on this node")
        shares = [dev for _, dev in others if dev.device == device] + [
            d for d in plan.devices if d.device == device and not d.admin_access
        ]
        memory = sum(d.memory_bytes for d in shares)
        cores = sum(d.cores for d in shares)
        if memory > target.memory_bytes or cores > FULL_CORES:
            return Conflict(
                f"claim {plan.ref}: shares of device {device} would exceed its capacity "
                f"(memory {memory} of {target.memory_bytes} bytes, cores {cores} of "
                f"{FULL_CORES}) with the {len(shares) - 1} share(s) already prepared"
            )
        # Each allocation result is one share (the published ``shares`` capacity).
        if max_shares is not None and len(shares) > max_shares:
            return Conflict(
                f"claim {plan.ref}: device {device} would have {len(shares)} shares prepared; "
                f"this node allows at most {max_shares} per GPU (its published shares capacity)"
            )
    return None


def _dynamic_conflict(
    plan: ClaimPlan, others: Sequence[tuple[ClaimRecord, DeviceRecord]], devices: DeviceTable
) -> Conflict | None:
    """Dynamic devices of one GPU prepared together must fit its counter set (each device
    counted once, however many shares it has): another claim never gets an overlapping
    placement, a placement beside the whole GPU, or an engine already taken. ``others`` holds
    the other claims' devices, admin access left out."""
    mine = sorted({d.device for d in plan.devices if not d.admin_access})
    for name in mine:
        target = devices.get(name)
        if target is None or target.placement is None:
            continue
        held: dict[str, ClaimRecord] = {}  # other claims' dynamic devices on this GPU
        for rec, dev in others:
            if _on_gpu(devices, dev.device, target):
                held.setdefault(dev.device, rec)
        if name in held:
            continue  # a share of the same whole device: its counters are taken once
        totals = MigGeometry.of(target.gpu).totals
        together = [*held, *(n for n in mine if n not in held and _on_gpu(devices, n, target))]
        used = {c: sum(_consumes(devices, n).get(c, 0) for n in together) for c in totals}
        if all(used[c] <= total for c, total in totals.items()):
            continue
        mine_amounts = _consumes(devices, name)
        clash = next(
            (
                n
                for n in sorted(held)
                if any(
                    mine_amounts.get(c, 0) + _consumes(devices, n).get(c, 0) > total
                    for c, total in totals.items()
                )
            ),
            min(held, default=""),
        )
        if not clash:
            return Conflict(
                f"claim {plan.ref}: its devices on GPU {target.gpu.minor} exceed the GPU's MIG "
                "resources together"
            )
        return Conflict(
            f"claim {plan.ref}: device {name} overlaps {clash} on the same GPU, which is "
            "prepared for another claim",
            held[clash],
        )
    return None


def _on_gpu(devices: DeviceTable, name: str, target: NodeDevice) -> bool:
    device = devices.get(name)
    return (
        device is not None and device.placement is not None and device.gpu.uuid == target.gpu.uuid
    )


def _consumes(devices: DeviceTable, name: str) -> Mapping[str, int]:
    device = devices.get(name)
    if device is None or device.placement is None:
        return {}
    geometry = MigGeometry.of(device.gpu)
    return geometry.totals if not device.is_mig else geometry.consumes(device.placement)


def check_conflicts(
    plan: ClaimPlan, checkpoint: Checkpoint, devices: DeviceTable, max_shares: int | None = None
) -> None:
    """:func:`find_conflict` as an exception: raises :class:`PrepareError` with its message."""
    conflict = find_conflict(plan, checkpoint, devices, max_shares)
    if conflict is not None:
        raise PrepareError(conflict.message)
