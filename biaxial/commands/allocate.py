"""``biaxial allocate FILE...``: the allocator alone, on one node.

The files hold Kubernetes objects (YAML or JSON; single, multi-document or ``List``): exactly
one Node (or ``--node NAME`` to pick one of several), DeviceClasses, ResourceSlices and
ResourceClaims. The project's DeviceClasses are loaded first, as ``biaxial simulate`` loads
them (the input's win by name; ``--no-default-classes`` leaves them out). Claims without
``status.allocation`` are allocated together, in file order; claims with one are cluster state
(their devices are in use). ``--gpu-policy`` orders the GPUs
(``binpack`` by default; ``first-fit`` is upstream's order).

Output is one JSON object::

    {"node": NAME, "outcome": "allocated" | "unschedulable" | "error", "message": TEXT,
     "claims": {"NAMESPACE/NAME": <exactly the v1 status.allocation object>}}

The exit code is 0 whenever a verdict was produced (including ``unschedulable``, also for a
node whose pools are invalid, with upstream's "invalid resource pools were encountered", and
``error``: an unknown class, a CEL error, an exhausted search), and 2 for malformed input, with
one clear line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NAME = "allocate"
HELP = "allocate ResourceClaims on one node (slices, classes, claims, node in; results out)"
ORDER = 25
EPILOG = """\
exit codes:
  0  a verdict was produced: allocated, unschedulable or error (see "outcome")
  2  bad input: an unreadable or invalid file, no node (one line on stderr)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifest files ('-' = stdin)")
    parser.add_argument("--node", metavar="NAME", help="the node to allocate on (if several)")
    parser.add_argument(
        "--gpu-policy",
        choices=("first-fit", "binpack", "spread"),
        default="binpack",
        help="GPU order on the node (default binpack; first-fit = upstream order)",
    )
    parser.add_argument(
        "--no-default-classes",
        action="store_true",
        help="do not load the project's deviceclasses/ first",
    )


def verdict(
    objects: list[dict[str, Any]],
    *,
    node_name: str | None,
    gpu_policy: str,
    default_classes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The allocate verdict for already-loaded objects (raises ManifestError for bad input)."""
    from driver.api.claims import DeviceClass, ResourceClaim  # noqa: PLC0415
    from driver.api.errors import BiaxialError, ManifestError, NodeAllocationError  # noqa: PLC0415
    from driver.api.model import ResourceSlice  # noqa: PLC0415
    from driver.api.nodes import Node  # noqa: PLC0415
    from driver.scheduling.policy import parse_gpu_policy  # noqa: PLC0415
    from driver.scheduling.scoring import gpu_order  # noqa: PLC0415
    from driver.structured.allocator import allocate  # noqa: PLC0415 - heavy imports stay out of --help
    from driver.structured.snapshot import ClusterSnapshot  # noqa: PLC0415

    policy = parse_gpu_policy(gpu_policy, "--gpu-policy")
    nodes: list[Node] = []
    classes = {c.name: c for c in map(DeviceClass.from_api, default_classes or ())}
    slices: list[ResourceSlice] = []
    claims: list[ResourceClaim] = []
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node":
            nodes.append(Node.from_api(obj))
        elif kind == "DeviceClass":
            device_class = DeviceClass.from_api(obj)
            classes[device_class.name] = device_class
        elif kind == "ResourceSlice":
            slices.append(ResourceSlice.from_api(obj))
        elif kind == "ResourceClaim":
            claims.append(ResourceClaim.from_api(obj))
        else:
            raise ManifestError(
                f"unsupported kind {kind!r} (allocate reads Node, DeviceClass, ResourceSlice, "
                "ResourceClaim)"
            )
    if node_name is not None:
        picked = [n for n in nodes if n.name == node_name]
        if not picked:
            known = ", ".join(n.name for n in nodes) or "none"
            raise ManifestError(f"--node {node_name}: no such Node in the input (have: {known})")
        node = picked[0]
    elif len(nodes) != 1:
        raise ManifestError(
            f"the input must hold exactly one Node, or use --node NAME (found {len(nodes)})"
        )
    else:
        node = nodes[0]
    pending = [c for c in claims if c.allocation is None]
    allocated = [c for c in claims if c.allocation is not None]
    out: dict[str, Any] = {"node": node.name, "outcome": "", "message": "", "claims": {}}
    if not pending:
        out.update(outcome="allocated", message="no unallocated claims in the input")
        return out
    try:
        snapshot = ClusterSnapshot.build(slices, list(classes.values()), allocated)
        results = allocate(snapshot, pending, node, order=gpu_order(policy))
    except NodeAllocationError as exc:
        # Upstream's ErrFailedAllocationOnNode: this node is unschedulable with that message.
        out.update(outcome="unschedulable", message=f"node {node.name}: {exc}")
        return out
    except BiaxialError as exc:
        out.update(outcome="error", message=str(exc))
        return out
    if results is None:
        out.update(
            outcome="unschedulable",
            message=f"cannot allocate all claims on node {node.name} "
            f"({', '.join(c.key for c in pending)})",
        )
        return out
    out.update(
        outcome="allocated",
        message=f"allocated {len(pending)} claim(s) on node {node.name}",
        claims={c.key: r.to_api() for c, r in zip(pending, results, strict=True)},
    )
    return out


def run(args: argparse.Namespace) -> int:
    from biaxial.simulate.manifests import load_objects  # noqa: PLC0415
    from biaxial.simulate.simulator import project_deviceclasses  # noqa: PLC0415

    result = verdict(
        load_objects(args.files),
        node_name=args.node,
        gpu_policy=args.gpu_policy,
        default_classes=None if args.no_default_classes else project_deviceclasses(),
    )
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
