"""``biaxial simulate --plot FILE``: draw a simulation's cluster (matplotlib, optional, imported
only when asked for; PNG, SVG or PDF by the file's suffix).

Up to :data:`MAX_PANELS` nodes: one panel per node, two bars per GPU — its memory and its
cores, each as a share of the GPU, stacked by pod (one colour per pod, the legend names them,
a label sits inside every segment it fits in, measured on the laid-out figure); a GPU a pod
holds whole is full on both bars (:func:`core_shares`), though its claim reserves no cores. A
GPU in MIG mode is one outlined bar with its partitions drawn inside it, each filled by the pod that
holds it or left empty, and labelled with its profile; on a dynamic-MIG GPU the partitions
biaxial would create sit at their memory slices (faint lines mark the slices). Beyond that,
one heat map: a row per node, a cell per GPU coloured by its memory use, MIG GPUs marked, so
50 or 500 nodes stay readable. The title (policies, placements, free GPUs, fragmentation)
and the legend fit inside the picture (constrained layout, the legend outside the panels):
:func:`render` builds the figure, :func:`plot` writes the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from biaxial.simulate.results import GpuUsage, SimulationResult
from driver.api.errors import BiaxialError, ManifestError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_PANELS: Final = 16
PANEL_COLUMNS: Final = 4
MAX_LEGEND: Final = 24
_FREE: Final = "#f2f2f2"
_EDGE: Final = "#777777"


def _title(result: SimulationResult) -> str:
    summary = result.summary()
    used = result.policies_used()
    policies = (
        "; ".join(f"{name} ({count})" for name, count in used.items())
        if used
        else f"defaults node {result.policies.node}, GPU {result.policies.gpu}"
    )
    return (
        f"{summary['placed']}/{summary['pods']} placed, {summary['gpusInUse']}/"
        f"{len(result.gpus)} GPUs in use, {summary['wholeGpusFree']} whole GPUs free, "
        f"fragmentation {summary['fragmentation']:.2f}\npolicies: {policies}"
    )


def _colours(result: SimulationResult) -> dict[str, Any]:
    import matplotlib as mpl  # noqa: PLC0415 - optional dependency

    pods = sorted({p for g in result.gpus for p in g.pod_names})
    palette = mpl.colormaps["tab20"]
    return {p: palette(i % 20) for i, p in enumerate(pods)}


def _short(pod: str) -> str:
    return pod.rsplit("/", maxsplit=1)[-1]


Labels = list[tuple[Any, Any]]  # (text, the bar segment it must fit in)


def _draw_gpu(ax: Any, x: float, gpu: GpuUsage, colour: dict[str, Any], labels: Labels) -> None:
    width = 0.38
    if gpu.mig:
        ax.bar(x, 1.0, width=2 * width, color="white", edgecolor="black", linewidth=1.2)
        slot = 1.0 / gpu.memory_slices if gpu.dynamic else 0.0
        for edge in range(1, gpu.memory_slices):
            ax.plot([x - width, x + width], [edge * slot] * 2, color=_EDGE, lw=0.3)
        bottom = 0.0
        for part in gpu.partitions:
            height = part.memory / gpu.memory if gpu.memory else 0.0
            if gpu.dynamic and part.start is not None:  # at its slices, gaps left free
                bottom, height = part.start * slot, part.size * slot
            fill = colour[part.pods[0]] if part.pods else _FREE
            (bar,) = ax.bar(x, height, width=2 * width, bottom=bottom, color=fill, edgecolor=_EDGE)
            text = part.profile + (f"\n{_short(part.pods[0])}" if part.pods else "")
            label = ax.text(x, bottom + height / 2, text, ha="center", va="center", fontsize=6)
            labels.append((label, bar))
            bottom += height
        return
    for offset, total, shares in (
        (-width / 2, gpu.memory, [(p, m) for p, m in gpu.pods]),
        (width / 2, gpu.cores, core_shares(gpu)),
    ):
        ax.bar(x + offset, 1.0, width=width, color=_FREE, edgecolor=_EDGE)
        bottom = 0.0
        for pod, amount in shares:
            height = amount / total if total else 0.0
            if height <= 0:
                continue
            (bar,) = ax.bar(x + offset, height, width=width, bottom=bottom, color=colour[pod])
            label = ax.text(
                x + offset,
                bottom + height / 2,
                _short(pod),
                ha="center",
                va="center",
                fontsize=6,
                rotation=90,
            )
            labels.append((label, bar))
            bottom += height


def core_shares(gpu: GpuUsage) -> list[tuple[str, int]]:
    """Cores per pod, as the cores bar draws them. A pod holding all the GPU's memory holds
    the GPU whole, and so all its cores, though its claim reserves none (cores default to 0):
    an empty bar would read as idle. Otherwise the GPU's used cores split in proportion to
    each pod's memory (the per-pod cores are not kept in the summary, only the total)."""
    whole = [p for p, m in gpu.pods if gpu.memory and m >= gpu.memory]
    if whole:
        return [(p, gpu.cores // len(whole)) for p in whole]
    total = sum(m for _, m in gpu.pods)
    if not gpu.cores_used or not total:
        return []
    return [(p, gpu.cores_used * m // total) for p, m in gpu.pods]


def _panels(result: SimulationResult) -> Figure:
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency

    nodes = result.node_names or ["(no nodes)"]
    columns = min(PANEL_COLUMNS, len(nodes))
    rows = -(-len(nodes) // columns)
    widest = max((sum(1 for g in result.gpus if g.node == n) for n in nodes), default=1) or 1
    figure = Figure(
        figsize=(max(6.0, columns * (1.0 + 0.75 * widest)), 2.0 + 2.8 * rows),
        layout="constrained",
    )
    colour = _colours(result)
    labels: Labels = []
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(nodes):
            ax.set_axis_off()
            continue
        node = nodes[index]
        gpus = [g for g in result.gpus if g.node == node]
        for x, gpu in enumerate(gpus):
            _draw_gpu(ax, float(x), gpu, colour, labels)
        ax.set_title(node, fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_xlim(-0.6, widest - 0.4)
        ax.set_xticks(
            range(len(gpus)),
            [f"{g.device}\n{'MIG' if g.mig else 'mem | cores'}" for g in gpus],
            fontsize=6,
        )
        ax.set_yticks([0, 0.5, 1], ["0", "50%", "100%"], fontsize=7)
    figure.suptitle(_title(result), fontsize=9)
    _legend(figure, colour)
    _fit_labels(figure, labels)
    return figure


def _fit_labels(figure: Figure, labels: Labels) -> None:
    """Lay the figure out, then hide every label that does not fit inside its bar segment
    (the legend still names the pod)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415

    canvas: Any = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    for label, bar in labels:
        text = label.get_window_extent(renderer)
        room = bar.get_window_extent(renderer)
        if text.height > room.height or text.width > room.width:
            label.set_visible(False)


def _legend(figure: Figure, colour: dict[str, Any]) -> None:
    from matplotlib.patches import Patch  # noqa: PLC0415 - optional dependency

    handles = [Patch(color=c, label=_short(p)) for p, c in list(colour.items())[:MAX_LEGEND]]
    if len(colour) > MAX_LEGEND:
        handles.append(Patch(color="white", label=f"... {len(colour) - MAX_LEGEND} more pods"))
    handles.append(Patch(facecolor=_FREE, edgecolor=_EDGE, label="free"))
    figure.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(6, len(handles)),
        fontsize=7,
        frameon=False,
    )


def _heat_map(result: SimulationResult) -> Figure:
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency

    nodes = result.node_names
    by_node = {n: [g for g in result.gpus if g.node == n] for n in nodes}
    widest = max((len(g) for g in by_node.values()), default=1) or 1
    cells = [
        [
            (gpus[i].memory_used / gpus[i].memory if gpus[i].memory else 0.0)
            if i < len(gpus)
            else float("nan")
            for i in range(widest)
        ]
        for gpus in by_node.values()
    ]
    figure = Figure(
        figsize=(max(6.0, 1.2 + 0.55 * widest), 2.2 + 0.22 * len(nodes)), layout="constrained"
    )
    ax = figure.subplots()
    image = ax.imshow(cells, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
    for row, gpus in enumerate(by_node.values()):
        for column, gpu in enumerate(gpus):
            if gpu.mig:
                ax.text(column, row, "MIG", ha="center", va="center", fontsize=5, color="white")
    ax.set_yticks(range(len(nodes)), nodes, fontsize=6)
    ax.set_xticks(range(widest), [f"gpu {i}" for i in range(widest)], fontsize=7)
    ax.set_xlabel("GPUs by position on the node", fontsize=8)
    colourbar = figure.colorbar(image, ax=ax, location="right", fraction=0.05)
    colourbar.set_label("memory in use", fontsize=8)
    figure.suptitle(_title(result), fontsize=9)
    return figure


def render(result: SimulationResult) -> Figure:
    """The figure: panels up to :data:`MAX_PANELS` nodes, a heat map beyond."""
    if len(result.node_names) > MAX_PANELS:
        return _heat_map(result)
    return _panels(result)


def plot(result: SimulationResult, path: str) -> None:
    """Write the picture to ``path`` (the format follows the suffix: png, svg, pdf)."""
    try:
        import matplotlib as mpl  # noqa: F401, PLC0415 - optional dependency, only for --plot
    except ImportError as exc:
        raise BiaxialError("--plot needs matplotlib: pip install 'biaxial[plot]'") from exc
    figure = render(result)
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ManifestError(f"--plot {path}: cannot write ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ManifestError(f"--plot {path}: {exc}") from exc
