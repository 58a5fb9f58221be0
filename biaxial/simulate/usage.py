"""Per physical GPU, what a simulated cluster's allocated claims hold: memory and cores used,
the pods holding them, MIG partitions drawn inside their GPU, and for dynamic MIG the
partitions taken, the memory slices left and the largest profile still placeable."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from biaxial.simulate.results import GpuUsage, PartitionUsage
from driver.api.claims import AllocationResult
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import JSON, Device, ResourceSlice
from driver.discovery.mig import MEMORY_SLICE_PREFIX


def gpu_usage(
    claims: Mapping[tuple[str, str], JSON],
    slices: Iterable[ResourceSlice],
    node_names: Sequence[str],
) -> list[GpuUsage]:
    """Per physical GPU: what every allocated claim holds (admin access is not use),
    with the pods each claim is reserved for."""
    held: dict[tuple[str, str, str], list[tuple[tuple[str, ...], int | None, int | None]]]
    held = {}
    for (namespace, _), raw in claims.items():
        allocation = (raw.get("status") or {}).get("allocation")
        if not allocation:
            continue
        holders = tuple(
            f"{namespace}/{r.get('name')}"
            for r in (raw.get("status") or {}).get("reservedFor") or ()
            if isinstance(r, Mapping) and r.get("resource") == "pods"
        ) or (f"{namespace}/{raw['metadata']['name']} (claim)",)
        for r in AllocationResult.from_api(allocation, "allocation").results:
            if r.admin_access:
                continue
            consumed = r.consumed_capacity
            memory = consumed["memory"].value() if consumed and "memory" in consumed else None
            cores = consumed["cores"].value() if consumed and "cores" in consumed else None
            held.setdefault((r.driver, r.pool, r.device), []).append((holders, memory, cores))
    position = {name: i for i, name in enumerate(node_names)}
    migs: dict[tuple[str, str], list[tuple[Device, PartitionUsage]]] = {}
    gpus: list[GpuUsage] = []
    ordered = sorted(slices, key=lambda s: (position.get(s.node_name or "", -1), s.name))
    dynamic = _DynamicMig(ordered, held)
    for s in ordered:
        if s.driver != DEFAULT_DRIVER_NAME:
            continue
        node = str(s.node_name or s.pool.name)
        for d in s.devices:
            if dynamic.is_placement(d):
                continue  # a possible partition: listed under its GPU once taken
            memory = _capacity(d, "memory")
            cores = _capacity(d, "cores")
            uses = held.get((s.driver, s.pool.name, d.name), [])
            if d.attributes.get("type") == "mig":
                parent = str(d.attributes.get("parentUUID", ""))
                part = PartitionUsage(
                    device=d.name,
                    profile=str(d.attributes.get("profile", "")),
                    memory=memory,
                    pods=tuple(p for holders, _, _ in uses for p in holders),
                )
                migs.setdefault((node, parent), []).append((d, part))
                continue
            pods: list[tuple[str, int]] = []
            used_memory = used_cores = 0
            for claim_pods, share_memory, share_cores in uses:
                amount = memory if share_memory is None else share_memory
                used_memory += amount
                used_cores += (
                    cores if share_memory is None and share_cores is None else (share_cores or 0)
                )
                pods.extend((p, amount) for p in claim_pods)
            usage = GpuUsage(
                node=node,
                device=d.name,
                uuid=str(d.attributes.get("uuid", "")),
                product=str(d.attributes.get("productName", "")),
                memory=memory,
                memory_used=used_memory,
                cores=cores,
                cores_used=used_cores,
                pods=tuple(pods),
            )
            gpus.append(dynamic.with_partitions(s, d, usage))
    for (node, parent), parts in migs.items():
        first = parts[0][0]
        minor = first.attributes.get("minor", first.attributes.get("index", ""))
        partitions = tuple(p for _, p in sorted(parts, key=lambda x: x[0].name))
        gpus.append(
            GpuUsage(
                node=node,
                device=f"gpu-{minor}",
                uuid=parent,
                product=str(first.attributes.get("productName", "")),
                memory=sum(p.memory for p in partitions),
                memory_used=sum(p.memory for p in partitions if p.pods),
                cores=100,
                cores_used=0,
                pods=(),
                partitions=partitions,
            )
        )
    return sorted(gpus, key=lambda g: (position.get(g.node, -1), _device_order(g.device)))


Held = Mapping[tuple[str, str, str], Sequence[tuple[tuple[str, ...], int | None, int | None]]]
"""(driver, pool, device) -> per allocated claim: the pods holding it, memory, cores."""


class _DynamicMig:
    """Dynamic-MIG bookkeeping of a simulated cluster: which devices are placements, which
    were taken (the partitions the plugin would create), and what is left of each GPU's
    counter set."""

    def __init__(self, slices: Sequence[ResourceSlice], held: Held) -> None:
        self.held = held
        self.left: dict[tuple[str, str, str], dict[str, int]] = {}  # (driver, pool, set)
        self.members: dict[tuple[str, str, str], list[tuple[Device, dict[str, int]]]] = {}
        for s in slices:
            for counter_set in s.shared_counters:
                key = (s.driver, s.pool.name, counter_set.name)
                self.left[key] = {k: v.value() for k, v in counter_set.counters.items()}
        for s in slices:
            for d in s.devices:
                for consumption in d.consumes_counters:
                    key = (s.driver, s.pool.name, consumption.name)
                    amounts = {k: v.value() for k, v in consumption.counters.items()}
                    self.members.setdefault(key, []).append((d, amounts))
                    if (s.driver, s.pool.name, d.name) in held and key in self.left:
                        for counter, amount in amounts.items():
                            self.left[key][counter] = self.left[key].get(counter, 0) - amount

    @staticmethod
    def is_placement(device: Device) -> bool:
        return bool(device.consumes_counters) and device.attributes.get("type") == "mig"

    def with_partitions(self, s: ResourceSlice, device: Device, usage: GpuUsage) -> GpuUsage:
        """A dynamic GPU's row with its partitions, free slices and largest placeable."""
        if not device.consumes_counters:
            return usage
        key = (s.driver, s.pool.name, device.consumes_counters[0].name)
        left = self.left.get(key, {})
        slots = sorted(c for c in left if c.startswith(MEMORY_SLICE_PREFIX))
        partitions: list[PartitionUsage] = []
        for member, amounts in self.members.get(key, ()):
            uses = self.held.get((s.driver, s.pool.name, member.name))
            if not self.is_placement(member) or not uses:
                continue
            starts = sorted(
                int(c.removeprefix(MEMORY_SLICE_PREFIX))
                for c in amounts
                if c.startswith(MEMORY_SLICE_PREFIX)
            )
            partitions.append(
                PartitionUsage(
                    device=member.name,
                    profile=str(member.attributes.get("profile", "")),
                    memory=_capacity(member, "memory"),
                    pods=tuple(dict.fromkeys(p for holders, _, _ in uses for p in holders)),
                    start=starts[0] if starts else 0,
                    size=len(starts),
                )
            )
        partitions.sort(key=lambda p: (p.start or 0, p.device))
        placeable = [
            member
            for member, amounts in self.members.get(key, ())
            if self.is_placement(member) and all(left.get(c, 0) >= a for c, a in amounts.items())
        ]
        largest = max(
            placeable,
            key=lambda m: (_capacity(m, "memory"), _capacity(m, "cores")),
            default=None,
        )
        return replace(
            usage,
            memory_used=usage.memory_used + sum(p.memory for p in partitions),
            partitions=tuple(partitions),
            memory_slices=len(slots),
            free_slices=sum(1 for c in slots if left[c] > 0),
            largest_placeable=str(largest.attributes.get("profile", "")) if largest else "",
        )


def _capacity(device: Device, name: str) -> int:
    return device.capacity[name].value.value() if name in device.capacity else 0


def _device_order(name: str) -> tuple[int, str]:
    digits = name.removeprefix("gpu-")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)
