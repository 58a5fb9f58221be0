"""``biaxial simulate --plot``: draw a simulation's placements as a PNG (matplotlib, optional,
imported only when asked for)."""

from __future__ import annotations

from biaxial.simulate.simulator import SimulationResult
from driver.api.errors import ManifestError


def plot(result: SimulationResult, path: str) -> None:
    """Draw nodes x GPUs: one column per node, one bar per GPU whose height is its memory,
    filled by pod; a dynamic-MIG GPU's partitions are drawn inside it at their memory slices
    (a slice is 1/``memorySlices`` of the bar), labelled with profile and pod (matplotlib
    with the Agg backend, imported here only)."""
    import matplotlib as mpl  # noqa: PLC0415 - optional dependency, only for --plot

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    nodes = result.node_names
    per_node = {n: [g for g in result.gpus if g.node == n] for n in nodes}
    widest = max((len(g) for g in per_node.values()), default=1) or 1
    figure, axes = plt.subplots(
        1, max(len(nodes), 1), figsize=(max(4.0, 2.2 * len(nodes)), 4.5), squeeze=False
    )
    pods = sorted({p for g in result.gpus for p, _ in g.pods})
    colours = plt.get_cmap("tab20")
    colour = {p: colours(i % 20) for i, p in enumerate(pods)}
    gib = 1024.0**3
    for ax, node in zip(axes[0], nodes or ["(no nodes)"], strict=False):
        gpus = per_node.get(node, [])
        for x, g in enumerate(gpus):
            ax.bar(x, g.memory / gib, color="#eeeeee", edgecolor="#888888", width=0.8)
            if g.memory_slices:
                slot = g.memory / gib / g.memory_slices
                for edge in range(1, g.memory_slices):
                    ax.plot([x - 0.4, x + 0.4], [edge * slot] * 2, color="#cccccc", lw=0.5)
                for part in g.partitions:
                    ax.bar(
                        x,
                        part.size * slot,
                        bottom=part.start * slot,
                        color=colour[part.pod],
                        edgecolor="black",
                        width=0.8,
                    )
                    ax.text(
                        x,
                        (part.start + part.size / 2) * slot,
                        f"{part.profile}\n{part.pod.split('/')[-1]}",
                        ha="center",
                        va="center",
                        fontsize=5,
                    )
                if g.partitions:
                    continue  # a cut GPU has no shares: its partitions are the picture
            bottom = 0.0
            for pod, memory in g.pods:
                height = memory / gib
                ax.bar(x, height, bottom=bottom, color=colour[pod], edgecolor="white", width=0.8)
                ax.text(
                    x, bottom + height / 2, pod.split("/")[-1], ha="center", va="center", fontsize=6
                )
                bottom += height
        ax.set_title(node, fontsize=9)
        ax.set_xticks(range(len(gpus)), [g.device for g in gpus], rotation=45, fontsize=7)
        ax.set_xlim(-0.6, widest - 0.4)
        ax.set_ylabel("GPU memory (GiB)", fontsize=8)
    summary = result.summary()
    figure.suptitle(
        f"node {result.policies.node} / GPU {result.policies.gpu}: {summary['placed']} placed, "
        f"{summary['wholeGpusFree']} whole GPUs free, fragmentation {summary['fragmentation']:.2f}",
        fontsize=9,
    )
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ManifestError(f"--plot {path}: cannot write ({exc.strerror or exc})") from exc
    finally:
        plt.close(figure)
