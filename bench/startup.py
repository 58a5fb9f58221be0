"""The controller's start-up in one process, phase by phase (``python -m bench.startup``).

What ``/readyz`` waits for at large clusters is CPU in the controller: importing its modules,
decoding the list pages, parsing what the informers keep (Nodes, ResourceSlices,
DeviceClasses as models), and building the decision engine from them. :mod:`bench.controller`
gives the total through the API emulator; this gives the parts, without HTTP. The list pages
of a :mod:`bench.scenarios` cluster (``mixed`` by default) are written once, 500 objects a
page as the informers ask for them; each repeat then runs a fresh child process that

1. imports what the phases need (the controller's cache, the engine, the codec);
2. decodes every page, one at a time as the informers do (:func:`kubeapi.codec.loads`; the
   ResourceSlices' typed, :func:`kubeapi.codec.loads_list`);
3. parses each object as the informers store it (the envelope check, then the model; a
   slice decoded typed from its typed form, :meth:`~driver.api.model.ResourceSlice.from_wire`);
   then drops the decoded page, as an informer does once it has read it (``free``: the
   decoded dicts' deallocation, a third of a second at 10,000 mixed nodes, besides what the
   decoding costs);
4. builds the engine as :class:`controller.feed.EngineFeed` does: classes, slices and nodes
   observed by an empty :class:`~driver.scheduling.decision.DecisionEngine`, then ``sync``;

with the garbage collector off, as the controller runs its start-up (:mod:`controller.app`),
and the project's modules compiled to bytecode first, as in the image
(:func:`bench.processes.compile_bytecode`): the imports are counted as a cluster runs them,
not their compilation where ``PYTHONDONTWRITEBYTECODE`` is set.
One row per repeat: CPU seconds per phase and in all, the child's peak RSS, and the load
average beside them. Compare two checkouts by running each in turn (A, B, A, B): the figures
are CPU time, which a loaded machine inflates less than wall time, but still inflates.

``python -m bench.startup --nodes 10000 --repeat 3``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
PAGE = 500
KINDS = ("ResourceSlice", "Node", "DeviceClass")


def write_pages(folder: Path, nodes: int, variant: str) -> None:
    """The cluster's list pages, one file per page (``KIND-N.json``)."""
    # The parent's alone: the child imports nothing of the project before its clock starts.
    from bench.scenarios import generate_mixed  # noqa: PLC0415
    from kubeapi import codec  # noqa: PLC0415

    scenario = generate_mixed(nodes, 0, variant=variant)
    lists = {
        "ResourceSlice": scenario.slices,
        "Node": scenario.nodes,
        "DeviceClass": scenario.classes,
    }
    for kind, items in lists.items():
        for start in range(0, len(items), PAGE):
            page = []
            for n, obj in enumerate(items[start : start + PAGE], start + 1):
                metadata = {"uid": f"uid-{kind}-{n}", "resourceVersion": str(n), **obj["metadata"]}
                page.append({**obj, "metadata": metadata})
            body = {"kind": f"{kind}List", "metadata": {"resourceVersion": "1"}, "items": page}
            (folder / f"{kind}-{start // PAGE:05d}.json").write_bytes(codec.dumps(body))


def measure(folder: Path) -> JSON:
    """The phases in this process (the child's side)."""
    import gc  # noqa: PLC0415 - nothing imported before the clock starts
    import resource  # noqa: PLC0415
    import time  # noqa: PLC0415

    gc.disable()
    clock = time.process_time
    started = clock()
    from controller.api import object_key  # noqa: PLC0415
    from controller.cache import envelope_problem, parse_or_skip  # noqa: PLC0415
    from driver.api.claims import DeviceClass  # noqa: PLC0415
    from driver.api.model import ResourceSlice, WireSlice  # noqa: PLC0415
    from driver.api.nodes import Node  # noqa: PLC0415
    from driver.scheduling.decision import DecisionEngine  # noqa: PLC0415
    from driver.scheduling.policy import PolicyDefaults  # noqa: PLC0415
    from kubeapi import codec  # noqa: PLC0415

    imports = clock() - started
    raw = {kind: [p.read_bytes() for p in sorted(folder.glob(f"{kind}-*.json"))] for kind in KINDS}
    parsers: dict[str, Any] = {
        "ResourceSlice": ResourceSlice.from_api,
        "Node": Node.from_api,
        "DeviceClass": DeviceClass.from_api,
    }
    decode = parse = free = 0.0
    stores: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    for kind, pages in raw.items():
        for body in pages:
            mark = clock()
            if kind == "ResourceSlice":  # as the slice informer reads its pages
                items = codec.loads_list(body, WireSlice)["items"]
            else:
                items = codec.loads(body)["items"]
            decoded = clock()
            store = stores[kind]
            for item in items:
                obj, wire = item, None
                if type(item) is codec.Typed:  # its envelope is its metadata's
                    obj, wire = {"metadata": item.value.metadata}, item
                if envelope_problem(obj) is not None:
                    continue
                key = object_key(obj)
                model = ResourceSlice.from_wire(wire.value) if wire is not None else None
                if model is None and wire is not None:
                    obj = codec.loads(bytes(wire.text))
                store[key] = model if model is not None else parse_or_skip(kind, parsers[kind], obj)
            parsed = clock()
            items = item = obj = wire = None  # the page goes, as after a relist's page
            decode += decoded - mark
            parse += parsed - decoded
            free += clock() - parsed
    mark = clock()
    engine = DecisionEngine.empty(defaults=PolicyDefaults())
    for key, device_class in stores["DeviceClass"].items():
        engine.observe_class(key, device_class)
    for key, resource_slice in stores["ResourceSlice"].items():
        engine.observe_slice(key, resource_slice)
    for key, node in stores["Node"].items():
        engine.observe_node(key, node)
    engine.sync()
    build = clock() - mark
    return {
        "imports": imports,
        "decode": decode,
        "parse": parse,
        "free": free,
        "build": build,
        "total": clock() - started,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "devices": sum(len(s.devices) for s in stores["ResourceSlice"].values() if s),
    }


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.startup", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--variant", default="mixed", help="bench.scenarios variant")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(Path(args.child))))
        return 0
    print(
        "| nodes | devices | imports | decode | parse | free | engine build | total CPU s "
        "| peak RSS MB | load |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    from bench.processes import compile_bytecode  # noqa: PLC0415 - the child imports none of it

    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        write_pages(Path(tmp), args.nodes, args.variant)
        for _ in range(args.repeat):
            load = _load()
            out = subprocess.run(
                [sys.executable, "-m", "bench.startup", "--child", tmp],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            row = json.loads(out.splitlines()[-1])
            print(
                f"| {args.nodes} | {row['devices']} | {row['imports']:.2f} | {row['decode']:.2f} "
                f"| {row['parse']:.2f} | {row['free']:.2f} | {row['build']:.2f} "
                f"| {row['total']:.2f} "
                f"| {row['rss_mb']:.0f} | {load}-{_load()} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
