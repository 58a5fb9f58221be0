"""``--plot``: a panel per node (memory and cores per GPU, stacked by pod, MIG partitions inside
their GPU) up to 16 nodes, a heat map beyond; the title and legend are never cut and labels
never overlap (checked on the laid-out figure, not by eye)."""

from __future__ import annotations

from itertools import combinations, pairwise
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.plot import MAX_PANELS, core_shares, plot, render
from biaxial.simulate.simulator import SimulationResult, simulate

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]


def requesting() -> SimulationResult:
    """The requesting-gpus examples: shares, whole GPUs, multi-GPU pods, a MIG partition."""
    objects = load_objects(
        [str(p) for p in sorted((ROOT / "examples" / "requesting-gpus").glob("*.yaml"))]
    )
    return simulate(objects, default_classes=CLASSES)


def cluster(nodes: int, pods: int, memory: int = 4000) -> SimulationResult:
    profiles = ("t4x4", "a10gx4", "h100-80gbx8")
    inventory = {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": f"node-{i:02d}", "gpus": profiles[i % 3]} for i in range(nodes)],
    }
    work: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"inference-{i}", "namespace": "default"},
            "spec": {
                "schedulerName": "biaxial",
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {
                            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory + 37 * i}
                        },
                    }
                ],
            },
        }
        for i in range(pods)
    ]
    return simulate([inventory, *work], default_classes=CLASSES)


def laid_out(figure: Figure) -> list[tuple[str, Any]]:
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in figure.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]


def assert_inside(figure: Figure, texts: list[tuple[str, Any]]) -> None:
    box = figure.bbox
    for text, extent in texts:
        assert extent.x0 >= box.x0 - 1, f"cut on the left: {text!r}"
        assert extent.x1 <= box.x1 + 1, f"cut on the right: {text!r}"
        assert extent.y0 >= box.y0 - 1, f"cut at the bottom: {text!r}"
        assert extent.y1 <= box.y1 + 1, f"cut at the top: {text!r}"


def test_panels_keep_title_legend_and_labels_whole_and_apart() -> None:
    result = requesting()
    figure = render(result)
    texts = laid_out(figure)
    assert_inside(figure, texts)
    title = figure.get_suptitle()
    assert title.startswith(f"{len(result.placements)}/")
    assert "policies: " in title
    assert len(figure.axes) == len(result.node_names)
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "free" in legend
    assert {p.pod.split("/")[1] for p in result.placements} <= set(legend)
    # Labels inside bars (pod names, MIG profiles) never overlap one another.
    renderer = figure.canvas.get_renderer()
    inner = [
        (t.get_text(), t.get_window_extent(renderer))
        for ax in figure.axes
        for t in ax.texts
        if t.get_visible()
    ]
    assert inner, "segments tall enough carry labels"
    for (a, box_a), (b, box_b) in combinations(inner, 2):
        assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"


def test_thin_segments_are_left_to_the_legend() -> None:
    # Twelve 1000 MiB shares binpacked on one T4: every segment is 6.5 % of the bar, too thin
    # for a label; the legend names them all instead.
    result = cluster(1, 12, memory=1000)
    figure = render(result)
    laid_out(figure)
    renderer = figure.canvas.get_renderer()
    boxes = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in figure.axes[0].texts
        if t.get_visible()
    ]
    for (a, box_a), (b, box_b) in combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"
    legend = {t.get_text() for t in figure.legends[0].get_texts()}
    assert {f"inference-{i}" for i in range(12)} <= legend


def test_mig_partitions_are_drawn_inside_their_gpu() -> None:
    figure = render(requesting())
    h100 = next(ax for ax in figure.axes if ax.get_title() == "gpu-h100")
    labels = [t.get_text() for t in h100.texts]
    assert sum(1 for t in labels if t.startswith("1g.10gb")) == 8  # 7 on GPU 6, 1 on GPU 7
    assert any(t.startswith("3g.40gb") for t in labels)
    ticks = [t.get_text() for t in h100.get_xticklabels()]
    assert ticks[6:] == ["gpu-6\nMIG", "gpu-7\nMIG"]
    for patch in h100.patches:  # every bar stays within its GPU's 0..100 %
        assert patch.get_y() >= -1e-9
        assert patch.get_y() + patch.get_height() <= 1 + 1e-9


def test_fifty_nodes_are_a_readable_heat_map() -> None:
    result = cluster(50, 120)
    figure = render(result)
    texts = laid_out(figure)
    assert_inside(figure, texts)
    heat = figure.axes[0]
    names = [t.get_text() for t in heat.get_yticklabels()]
    assert names == result.node_names
    renderer = figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in heat.get_yticklabels()]
    for a, b in pairwise(boxes):
        assert not a.overlaps(b), "node names overlap"
    assert "memory in use" in [t for t, _ in texts]
    assert len(result.node_names) > MAX_PANELS


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_plot_writes_the_format_of_the_suffix(tmp_path: Path, suffix: str) -> None:
    target = tmp_path / f"cluster{suffix}"
    plot(requesting(), str(target))
    head = target.read_bytes()[:8]
    assert {
        ".png": head.startswith(b"\x89PNG"),
        ".svg": b"<?xml" in head or b"<svg" in head,
        ".pdf": head.startswith(b"%PDF"),
    }[suffix]


def test_a_whole_gpu_is_drawn_full_on_every_axis() -> None:
    # Before: a whole GPU (all its memory, no cores reserved) had an empty cores bar, which
    # reads as idle: core_shares gave [] for legacy-two-gpus' and allreduce's GPUs.
    gpus = {(g.node, g.device): g for g in requesting().gpus}
    for key, pod in (
        (("gpu-t4", "gpu-2"), "default/legacy-two-gpus"),
        (("gpu-h100", "gpu-0"), "default/allreduce-0"),
    ):
        gpu = gpus[key]
        assert gpu.pods == ((pod, gpu.memory),)
        assert core_shares(gpu) == [(pod, gpu.cores)]
    # A shared GPU keeps each pod's share: two embedders of 25 cores each.
    assert core_shares(gpus[("gpu-t4", "gpu-0")]) == [
        ("default/embedder-0", 25),
        ("default/embedder-1", 25),
    ]
