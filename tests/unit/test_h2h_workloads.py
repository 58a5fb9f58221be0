"""The head-to-head's workload shapes (``bench.h2h.workloads``) and its report's pure parts:
what each run seeds and creates, without an API server."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.h2h import upstream
from bench.h2h.report import pattern_lines, pattern_summary, read_json, tables, write_json
from bench.h2h.run import _Tracker
from bench.h2h.workloads import (
    DEVICES_PER_NODE,
    INIT_NAMESPACE,
    MIXED_SHAPES,
    PATTERNS,
    STEADY,
    STEADY_IN_FLIGHT,
    WORKLOADS,
    churn_shape,
    fill_count,
    gpu_fill,
    mixed_shape,
    patterns_shape,
    shape,
    steady_shape,
)
from kubeapi import ListResult


@pytest.mark.parametrize(
    ("fill", "per_pod", "held"),
    [("empty", 1, 0), ("half", 1, 2500), ("full", 1, 4990), ("full", 2, 4980)],
)
def test_fill_levels_are_scheduler_perfs(fill: str, per_pod: int, held: int) -> None:
    # SchedulingWithResourceClaimTemplate/{empty,half,full}_500nodes: initClaims 0, 2500, 4990
    assert fill_count(fill, 500, per_pod) == held


def test_fill_level_unknown_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fill"):
        fill_count("most", 10, 1)


def test_steady_state_holds_devices_node_by_node() -> None:
    inventory = steady_shape("claim-template-full", 3, 40)
    assert inventory.in_flight == STEADY_IN_FLIGHT
    assert len(inventory.pods) == 40
    assert len(inventory.held) == 3 * DEVICES_PER_NODE - STEADY_IN_FLIGHT
    held = [
        (
            claim["status"]["allocation"]["devices"]["results"][0]["pool"],
            claim["status"]["allocation"]["devices"]["results"][0]["device"],
        )
        for claim in inventory.held
    ]
    assert len(set(held)) == len(held)  # never a device twice
    per_node = Counter(pool for pool, _ in held)
    # full leaves its free devices on the last node: the first two are held whole
    assert per_node == {"node-00000": 10, "node-00001": 10}
    assert all(c["metadata"]["namespace"] == INIT_NAMESPACE for c in inventory.held)
    assert all("reservedFor" not in c["status"] for c in inventory.held)


def test_steady_match_attribute_holds_whole_pairs_and_streams_pairs() -> None:
    inventory = steady_shape("match-attribute-half", 4, 100)
    assert len(inventory.pods) == 50  # a pair a pod
    devices = {
        (r["pool"], r["device"])
        for c in inventory.held
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    assert len(devices) == 20
    for pool, device in devices:  # a pair (2k, 2k+1) is held whole or not at all
        index = int(device.removeprefix("device-"))
        assert (pool, f"device-{index ^ 1}") in devices
    request = inventory.templates[0]["spec"]["spec"]["devices"]
    assert request["requests"][0]["exactly"]["count"] == 2
    assert request["constraints"][0]["matchAttribute"].endswith("/group")


def test_every_workload_has_a_shape() -> None:
    for workload in WORKLOADS:
        if workload in ("mixed", "churn"):
            continue  # below, at their own sizes
        inventory = shape(workload, 2, 20)
        assert inventory.workload == workload
        assert (inventory.in_flight is not None) == (workload in STEADY)
    with pytest.raises(ValueError, match="unknown workload"):
        shape("nope", 2, 2)


def test_mixed_keeps_only_what_kube_scheduler_expresses() -> None:
    inventory = mixed_shape(20, 120)
    assert len(inventory.pods) == 120
    shapes = {p["metadata"]["name"].rsplit("-", 2)[0] for p in inventory.pods}
    assert shapes <= set(MIXED_SHAPES)
    assert "legacy-whole" in shapes  # nvidia.com/gpu through the bridge class
    for pod in inventory.pods:
        assert "annotations" not in pod["metadata"]  # no per-pod policy
        limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
        assert set(limits) <= {"nvidia.com/gpu"}  # no HAMi gpumem / gpucores
        claims = inventory.claims[pod["metadata"]["name"]]
        refs = {r["resourceClaimName"] for r in pod["spec"].get("resourceClaims", ())}
        assert refs == {c["metadata"]["name"] for c in claims}
        for claim in claims:
            for request in claim["spec"]["devices"]["requests"]:
                assert request["exactly"]["deviceClassName"] != "mig.biaxial.dev"
    # no owner the API server would not know (the garbage collector would delete the slices)
    assert all("ownerReferences" not in s["metadata"] for s in inventory.slices)
    assert all("uid" not in n["metadata"] for n in inventory.nodes)
    assert mixed_shape(20, 120).pods == inventory.pods  # deterministic


def test_four_patterns_on_the_reference_cluster() -> None:
    inventory = patterns_shape()
    assert [n["metadata"]["name"] for n in inventory.nodes] == ["gpu-t4", "gpu-a10g"]
    assert sorted({s["spec"]["nodeName"] for s in inventory.slices}) == ["gpu-a10g", "gpu-t4"]
    assert sum(len(s["spec"]["devices"]) for s in inventory.slices) == 8
    assert list(inventory.patterns) == list(PATTERNS)
    for pattern, pods in inventory.patterns.items():
        assert len(pods) == 4
        for pod in pods:
            annotations = pod["metadata"]["annotations"]
            assert (
                annotations["biaxial.dev/node-policy"],
                annotations["biaxial.dev/gpu-policy"],
            ) == PATTERNS[pattern]
    share = inventory.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert share["capacity"]["requests"]["memory"] == "7500Mi"


def test_pattern_summary_and_table() -> None:
    placed = [
        {"pod": "p0", "node": "gpu-t4", "device": "gpu-t4/gpu-0"},
        {"pod": "p1", "node": "gpu-t4", "device": "gpu-t4/gpu-0"},
        {"pod": "p2", "node": "gpu-a10g", "device": "gpu-a10g/gpu-1"},
        {"pod": "p3", "node": "", "device": ""},
    ]
    assert pattern_summary(placed) == (2, 2)
    run = {"scheduler": "biaxial", "qps": 5000, "placements": dict.fromkeys(PATTERNS, placed)}
    lines = pattern_lines([run])
    assert any("t4/gpu-0 t4/gpu-0 a10g/gpu-1 pending" in line for line in lines)


def test_scheduler_perf_data_items_are_read() -> None:
    document = {
        "version": "v1",
        "dataItems": [
            {
                "data": {"Average": 81.5, "Perc50": 80, "Perc90": 95, "Perc99": 101},
                "unit": "pods/s",
                "labels": {
                    "Metric": "SchedulingThroughput",
                    "Name": "BenchmarkPerfScheduling/SchedulingWithResourceClaimTemplate/"
                    "empty_500nodes/test",
                },
            },
            {
                "data": {"Perc50": 3.2},
                "unit": "ms",
                "labels": {"Metric": "scheduler_framework_extension_point_duration_seconds"},
            },
        ],
    }
    assert upstream.parse_data_items(document) == [
        {
            "workload": "SchedulingWithResourceClaimTemplate/empty_500nodes",
            "pods_per_s": 81.5,
            "perc50": 80.0,
            "perc90": 95.0,
            "perc99": 101.0,
        }
    ]


def _allocated(name: str, *results: tuple[str, str, str | None]) -> dict[str, object]:
    """A claim allocated on (pool, device, consumed memory or None for the whole GPU)."""
    rows = []
    for pool, device, memory in results:
        row: dict[str, object] = {
            "request": "gpu",
            "driver": "gpu.biaxial.dev",
            "pool": pool,
            "device": device,
        }
        if memory is not None:
            row["consumedCapacity"] = {"memory": memory}
            row["shareID"] = f"{name}-{device}"
        rows.append(row)
    return {
        "metadata": {"name": name, "namespace": "bench"},
        "status": {"allocation": {"devices": {"results": rows}}},
    }


def test_gpu_fill_counts_stranded_memory_as_the_simulator_does() -> None:
    slices = churn_shape(2, 10).slices  # 2 nodes x 8 A100-80GB
    gpus = sum(len(s["spec"]["devices"]) for s in slices)
    assert gpus == 16
    claims = [
        _allocated("share-a", ("node-00000", "gpu-0", "10Gi")),
        _allocated("share-b", ("node-00000", "gpu-0", "20Gi")),  # gpu-0: 50 GiB stranded
        _allocated("whole", ("node-00000", "gpu-1", None)),  # all of it: nothing stranded
        _allocated("halves-1", ("node-00000", "gpu-2", "40Gi")),
        _allocated("halves-2", ("node-00000", "gpu-2", "40Gi")),  # full by shares
        _allocated("small", ("node-00001", "gpu-7", "10Gi")),  # 70 GiB stranded
        _allocated("train", *(("node-00001", f"gpu-{i}", "80Gi") for i in range(4))),
        {"metadata": {"name": "pending", "namespace": "bench"}, "status": {}},  # not allocated
    ]
    fill = gpu_fill(claims, slices)
    assert fill["whole_gpus_free"] == 16 - 8
    assert fill["stranded_gpus"] == 2
    assert fill["stranded_gib"] == pytest.approx(50 + 70)
    assert fill["fragmentation"] == pytest.approx(120 / (120 + 8 * 80), abs=1e-4)
    assert gpu_fill([], slices) == {
        "whole_gpus_free": 16,
        "stranded_gpus": 0,
        "stranded_gib": 0.0,
        "fragmentation": 0.0,
    }


def _run(**fields: object) -> dict[str, object]:
    """A run's JSON object as ``bench.h2h.run.row`` writes it."""
    return {
        "workload": "claim-template-half",
        "nodes": 2,
        "devices": "10 devices",
        "held_devices": 10,
        "scheduler": "biaxial",
        "qps": 5000,
        "burst": 5000,
        "pods": 12,
        "bound": 12,
        "seconds": 1.0,
        "pods_per_s": 12.0,
        "pods_per_s_p50": 12.0,
        "pods_per_s_p90": 12.0,
        "pods_per_s_p99": 12.0,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "requests_per_pod": 4.0,
        "cpu_s": 0.1,
        "cpu_s_per_pod": 0.01,
        "rss_mb": 50.0,
        "load_avg": 1.0,
        "watch_relists": 0,
        **fields,
    }


def test_churn_table_reports_stranded_gpus() -> None:
    run = _run(
        workload="churn",
        devices="8 A100-80GB (shareable)",
        held_devices=0,
        whole_gpus_free=8,
        stranded_gpus=2,
        stranded_gib=120.0,
        fragmentation=0.1579,
        training_placed=2,
        training_pods=2,
        pending=0,
    )
    lines = tables([run])
    assert any("GPUs with stranded memory" in line and line.endswith(" 2") for line in lines)
    assert any("120 (0.16)" in line for line in lines)


def test_repeated_runs_share_a_column_and_sizes_get_their_own_table(tmp_path: Path) -> None:
    first = [_run(scheduler="kube-scheduler", pods_per_s=9.0), _run(pods_per_s=11.0)]
    second = [_run(scheduler="kube-scheduler", pods_per_s=10.0), _run(pods_per_s=13.0)]
    bigger = [_run(nodes=20, pods_per_s=30.0)]
    write_json(tmp_path / "a.json", first)
    write_json(tmp_path / "b.json", second + bigger, [{"workload": "x", "pods_per_s": 1.0}])
    runs, upstream_items = read_json([tmp_path / "a.json", tmp_path / "b.json"])
    assert upstream_items == [{"workload": "x", "pods_per_s": 1.0}]
    lines = tables(runs)
    titles = [line for line in lines if line.startswith("claim-template-half:")]
    assert [t.split(",")[0] for t in titles] == [
        "claim-template-half: 2 nodes x 10 devices",
        "claim-template-half: 20 nodes x 10 devices",
    ]
    assert "kube-scheduler @5000/5000 (2 runs)" in lines[1]
    assert "biaxial @5000/5000 (2 runs)" in lines[1]
    average = next(line for line in lines if line.strip().startswith("pods/s average"))
    assert [cell.strip() for cell in average.split("|")[1:]] == ["9.0; 10.0", "11.0; 13.0"]


def test_churn_stream_scales_with_the_nodes_and_is_deterministic() -> None:
    large = churn_shape(8, 120)  # 15 arrivals a node, as 300 at 20 nodes and 7500 at 500
    assert large.churn is not None
    assert [len(a) for a, _ in large.churn.rounds] == [24] * 5
    assert len(large.churn.wave) == 8 // 4 + 2 * 8
    assert churn_shape(8, 120).pods == large.pods
    alive: set[str] = set()
    for arrivals, departures in large.churn.rounds:
        alive |= {p["metadata"]["name"] for p in arrivals}
        assert set(departures) <= alive  # only pods alive leave
        alive -= set(departures)


class _SilentWatchApi:
    """An API whose pod watch never delivers anything (the stall once seen at load 6) and
    whose list shows ``bound`` pods bound."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.watches = 0

    async def list(self, _resource: object) -> ListResult:
        items = [
            {"metadata": {"name": n, "resourceVersion": "2"}, "spec": {"nodeName": "node-1"}}
            for n in self.bound
        ]
        return ListResult(items=items, resource_version="2")

    async def watch(self, _resource: object, **_kwargs: object) -> AsyncIterator[object]:
        self.watches += 1
        await asyncio.Event().wait()
        yield  # pragma: no cover - never reached


def test_a_stall_is_confirmed_with_a_list_and_a_silent_watch_restarted() -> None:
    """A run stops for a stall only when a list of the pods shows nothing bound either: a
    watch that stopped delivering is restarted, and what it missed is counted."""

    async def scenario() -> tuple[bool, bool, dict[str, int], int]:
        api = _SilentWatchApi()
        async with _Tracker(api, "biaxial", {}) as tracker:  # type: ignore[arg-type]
            for _ in range(10):  # let the watch task start
                await asyncio.sleep(0)
            api.bound = ["p-1", "p-2"]
            first = await tracker.stalled()
            second = await tracker.stalled()
            for _ in range(10):  # let the restarted one start
                await asyncio.sleep(0)
            return first, second, tracker.watch_figures(), api.watches

    first, second, figures, watches = asyncio.run(scenario())
    assert (first, second) == (False, True)
    assert figures == {"watch_relists": 0, "watch_missed": 2}
    assert watches == 2  # the first watch, then the one restarted from the list
