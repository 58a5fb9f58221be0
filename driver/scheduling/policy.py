"""Scheduling policies on the two axes, and how a pod chooses them.

A pod picks its node-axis and GPU-axis policy with annotations (on the pod, i.e. the pod
template of a Deployment):

* ``biaxial.dev/node-policy`` and ``biaxial.dev/gpu-policy``: ``binpack`` | ``spread``;
* the HAMi keys ``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy`` are
  accepted too, so HAMi manifests run unchanged; when both spellings are present, biaxial's own
  key wins.

Anything not given comes from the cluster defaults (:class:`PolicyDefaults`, built from the
controller's or simulator's settings). ``first-fit`` (upstream's device order, no scoring) is a
GPU-axis value for settings and flags only; annotations accept exactly ``binpack`` and
``spread``. An unknown value is a :class:`~driver.api.errors.PolicyError` naming the key and the
allowed values, never a silent fallback (HAMi's ``topology-aware``, ``mutex`` and ``numa`` GPU
policies, and HAMi's comma lists of policies, are named as unsupported).

Pure functions over plain data; nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from driver.api.errors import PolicyError, quoted

NodePolicy = Literal["binpack", "spread"]
GpuPolicy = Literal["binpack", "spread", "first-fit"]

NODE_POLICIES: Final[tuple[str, ...]] = get_args(NodePolicy)
GPU_POLICIES: Final[tuple[str, ...]] = get_args(GpuPolicy)
ANNOTATION_POLICIES: Final[tuple[str, ...]] = ("binpack", "spread")

NODE_POLICY_ANNOTATION: Final = "biaxial.dev/node-policy"
GPU_POLICY_ANNOTATION: Final = "biaxial.dev/gpu-policy"
HAMI_NODE_POLICY_ANNOTATION: Final = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY_ANNOTATION: Final = "hami.io/gpu-scheduler-policy"
#: HAMi GPU policies biaxial does not have (HAMi pkg/util/types.go; HAMi chains them in lists).
HAMI_ONLY_GPU_POLICIES: Final = frozenset({"topology-aware", "mutex", "numa"})


@dataclass(frozen=True, slots=True)
class PolicyDefaults:
    """Cluster-wide defaults, used when a pod does not choose."""

    node: NodePolicy = "binpack"
    gpu: GpuPolicy = "binpack"

    @classmethod
    def parse(cls, node: str, gpu: str) -> PolicyDefaults:
        """Validate defaults given as text (flags, environment, settings files)."""
        return cls(
            node=parse_node_policy(node, "node policy"), gpu=parse_gpu_policy(gpu, "GPU policy")
        )


@dataclass(frozen=True, slots=True)
class PodPolicies:
    """The two policies in force for one pod."""

    node: NodePolicy
    gpu: GpuPolicy


def parse_node_policy(value: str, where: str) -> NodePolicy:
    """``binpack`` or ``spread``; anything else is a PolicyError mentioning ``where``."""
    if value == "binpack":
        return "binpack"
    if value == "spread":
        return "spread"
    raise PolicyError(
        f"{where}: unknown policy {quoted(value)} (allowed: {', '.join(NODE_POLICIES)})"
    )


def parse_gpu_policy(value: str, where: str) -> GpuPolicy:
    """``binpack``, ``spread`` or ``first-fit``; anything else is a PolicyError."""
    if value == "first-fit":
        return "first-fit"
    if value in ANNOTATION_POLICIES:
        return parse_node_policy(value, where)
    raise PolicyError(
        f"{where}: unknown policy {quoted(value)} (allowed: {', '.join(GPU_POLICIES)})"
    )


def _annotation(annotations: Mapping[str, str], own: str, hami: str) -> tuple[str, str] | None:
    for key in (own, hami):
        value = annotations.get(key)
        if value is not None:
            return key, value
    return None


def policies_for_pod(annotations: Mapping[str, str], defaults: PolicyDefaults) -> PodPolicies:
    """Resolve a pod's policies from its annotations and the defaults.

    Raises :class:`PolicyError` for an unknown value, naming the annotation.
    """
    node: NodePolicy = defaults.node
    gpu: GpuPolicy = defaults.gpu
    found = _annotation(annotations, NODE_POLICY_ANNOTATION, HAMI_NODE_POLICY_ANNOTATION)
    if found is not None:
        node = parse_node_policy(found[1].strip(), f"annotation {found[0]}")
    found = _annotation(annotations, GPU_POLICY_ANNOTATION, HAMI_GPU_POLICY_ANNOTATION)
    if found is not None:
        key, value = found
        if value.strip() not in ANNOTATION_POLICIES:
            hint = ""
            if key == HAMI_GPU_POLICY_ANNOTATION and set(value.replace(" ", "").split(",")) & (
                HAMI_ONLY_GPU_POLICIES
            ):
                hint = (
                    f"; HAMi's {', '.join(sorted(HAMI_ONLY_GPU_POLICIES))} GPU policies (and "
                    "lists of them) are not supported"
                )
            raise PolicyError(
                f"annotation {key}: unknown policy {quoted(value)} "
                f"(allowed: {', '.join(ANNOTATION_POLICIES)}{hint})"
            )
        gpu = parse_gpu_policy(value.strip(), f"annotation {key}")
    return PodPolicies(node=node, gpu=gpu)
