"""The node filter: can this pod run on this node at all, GPUs aside?

The checks and their wording follow kube-scheduler's filter plugins, so a pod's
"0/N nodes are available: ..." message reads as users expect:

==============================  ==================================================
check                           reason (one per node, the first that fails)
==============================  ==================================================
NodeUnschedulable               ``node(s) were unschedulable`` (unless tolerated)
TaintToleration                 ``node(s) had untolerated taint {key: value}``
(node not Ready)                as the node lifecycle controller's taint
                                ``node.kubernetes.io/not-ready`` would say
NodeAffinity                    ``node(s) didn't match Pod's node affinity/selector``
NodePorts                       ``node(s) didn't have free ports for the requested pod
                                ports`` (:mod:`driver.scheduling.nodeports`)
NodeResourcesFit                ``Insufficient cpu`` / ``Insufficient memory`` /
                                ``Too many pods`` / ``Insufficient <resource>``
==============================  ==================================================

Only ``NoSchedule`` and ``NoExecute`` taints filter (``PreferNoSchedule`` is a preference).
Pod resource requests are computed as kube-scheduler does: the larger of the sum over regular
containers plus sidecars and, for each init container, its own request plus the sidecars
started before it; pod-level ``spec.resources`` (cpu, memory, hugepages) replaces that sum for
the resources it names, as the API server defaults and kube-scheduler reads it (a pod-level
limit stands for a missing pod-level request when no container requests the resource); plus
``spec.overhead``. Requests default to limits when absent, as the API server defaults them.
Extended resources that the node does not advertise are left to DRA (the caller passes them in
``dra_resources``) and are not checked here.

:class:`PodSchedulingFacts` is parsed once per pod; :func:`filter_node` is then a cheap, pure
function of (facts, node, the node's current usage). Nothing mutates its inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from driver.api.errors import ManifestError, QuantityError
from driver.api.nodes import Node, NodeTaint, node_selector_matches
from driver.api.quantity import Quantity
from driver.scheduling.nodeports import REASON_PORTS, HostPort, PortSet, host_ports

NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
REASON_UNSCHEDULABLE: Final = "node(s) were unschedulable"
REASON_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS: Final = "Too many pods"
_FILTERING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
_MILLI_RESOURCES: Final = frozenset({"cpu"})


@dataclass(frozen=True, slots=True)
class PodToleration:
    """A core/v1 pod toleration."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.effect and self.effect != effect:
            return False
        if self.key and self.key != key:
            return False
        if not self.key and self.operator != "Exists":
            return False
        if self.operator == "Exists":
            return True
        return self.value == value


@dataclass(frozen=True, slots=True)
class PodSchedulingFacts:
    """What the node filter needs from a pod, parsed once. Resource amounts are integers:
    cpu in millicores, everything else in whole units (memory in bytes)."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_affinity: Mapping[str, Any] | None = None
    tolerations: tuple[PodToleration, ...] = ()
    requests: Mapping[str, int] = field(default_factory=dict)
    host_ports: tuple[HostPort, ...] = ()

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodSchedulingFacts:
        meta = pod.get("metadata") or {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"
        spec = pod.get("spec") or {}
        where = f"pod {name}"
        if not isinstance(spec, Mapping):
            raise ManifestError(f"{where}: spec must be an object")
        selector = spec.get("nodeSelector") or {}
        if not isinstance(selector, Mapping):
            raise ManifestError(f"{where}: spec.nodeSelector must be an object")
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        if affinity is not None and not isinstance(affinity, Mapping):
            raise ManifestError(f"{where}: required node affinity must be an object")
        tolerations = []
        for i, t in enumerate(spec.get("tolerations") or ()):
            if not isinstance(t, Mapping):
                raise ManifestError(f"{where}: tolerations[{i}] must be an object")
            operator = t.get("operator") or "Equal"
            if operator not in ("Equal", "Exists"):
                raise ManifestError(f"{where}: tolerations[{i}]: unknown operator {operator!r}")
            tolerations.append(
                PodToleration(
                    key=str(t.get("key") or ""),
                    operator=operator,
                    value=str(t.get("value") or ""),
                    effect=str(t.get("effect") or ""),
                )
            )
        return cls(
            name=name,
            node_selector={str(k): str(v) for k, v in selector.items()},
            required_affinity=dict(affinity) if affinity else None,
            tolerations=tuple(tolerations),
            requests=pod_requests(pod, where),
            host_ports=host_ports(pod, where),
        )

    def named(self, name: str) -> PodSchedulingFacts:
        """The same facts for another pod whose spec is the same (a replica), named ``name``;
        the parsed parts are shared, as nothing changes them."""
        return PodSchedulingFacts(
            name,
            self.node_selector,
            self.required_affinity,
            self.tolerations,
            self.requests,
            self.host_ports,
        )

    def tolerates(self, taint: NodeTaint) -> bool:
        return any(t.tolerates(taint.key, taint.value, taint.effect) for t in self.tolerations)


@functools.lru_cache(maxsize=4096)
def _known_amount(resource: str, value: str | int) -> int | None:
    """:func:`_amount` of a valid value (None: invalid, for :func:`_amount` to say why);
    pods of one template repeat the same few values."""
    try:
        quantity = Quantity.of(value)
    except QuantityError:
        return None
    if quantity.sign() < 0:
        return None
    return quantity.milli_value() if resource in _MILLI_RESOURCES else quantity.value()


def _amount(resource: str, value: Any, where: str) -> int:
    if type(value) is str or type(value) is int:
        known = _known_amount(resource, value)
        if known is not None:
            return known
    try:
        quantity = Quantity.of(value)
    except QuantityError as exc:
        raise ManifestError(f"{where}: resource {resource}: {exc}") from exc
    if quantity.sign() < 0:
        raise ManifestError(f"{where}: resource {resource} must not be negative")
    return quantity.milli_value() if resource in _MILLI_RESOURCES else quantity.value()


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ManifestError(f"{where}: resources must be an object")
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return {str(k): _amount(str(k), v, where) for k, v in merged.items()}


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value


def _pod_level(resource: str) -> bool:
    """A resource pod-level ``spec.resources`` may set (``IsSupportedPodLevelResource``)."""
    return resource in ("cpu", "memory") or resource.startswith("hugepages-")


def _apply_pod_level(total: dict[str, int], resources: Any, where: str) -> None:
    """Pod-level requests replace the containers' sum for the resources they name; a
    pod-level limit stands for the request of a resource no container requests (the API
    server's defaulting of pod-level requests)."""
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise ManifestError(f"{where}: spec.resources must be an object")
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise ManifestError(f"{where}: spec.resources requests and limits must be objects")
    for key, value in limits.items():
        name = str(key)
        if _pod_level(name) and name not in requests and name not in total:
            total[name] = _amount(name, value, f"{where} pod-level limits")
    for key, value in requests.items():
        name = str(key)
        if _pod_level(name):
            total[name] = _amount(name, value, f"{where} pod-level requests")


def pod_requests(pod: Mapping[str, Any], where: str = "pod") -> dict[str, int]:
    """kube-scheduler's effective pod request (containers, sidecars, init containers, overhead)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        _add(total, _container_requests(c, f"{where} container {c.get('name')!r}"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        req = _container_requests(c, f"{where} init container {c.get('name')!r}")
        if c.get("restartPolicy") == "Always":
            _add(sidecars, req)
            _add(total, req)
            continue
        with_sidecars = dict(sidecars)
        _add(with_sidecars, req)
        for key, value in with_sidecars.items():
            init_peak[key] = max(init_peak.get(key, 0), value)
    for key, value in init_peak.items():
        total[key] = max(total.get(key, 0), value)
    _apply_pod_level(total, spec.get("resources"), where)
    overhead = spec.get("overhead") or {}
    _add(total, {str(k): _amount(str(k), v, f"{where} overhead") for k, v in overhead.items()})
    return total


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """What the pods already on a node request (same units as :class:`PodSchedulingFacts`)."""

    requested: Mapping[str, int] = field(default_factory=dict)
    pods: int = 0
    nonzero_cpu: int = 0  # the requests scoring counts (see nonzero_requests)
    nonzero_memory: int = 0

    def plus(self, requests: Mapping[str, int]) -> NodeUsage:
        merged = dict(self.requested)
        _add(merged, requests)
        cpu, memory = nonzero_requests(requests)
        return NodeUsage(
            requested=merged,
            pods=self.pods + 1,
            nonzero_cpu=self.nonzero_cpu + cpu,
            nonzero_memory=self.nonzero_memory + memory,
        )

    def plus_all(self, requests: Iterable[Mapping[str, int]]) -> NodeUsage:
        """:meth:`plus` of each in turn, in one pass (no usage built per pod between)."""
        merged = dict(self.requested)
        pods, cpu, memory = self.pods, self.nonzero_cpu, self.nonzero_memory
        for more in requests:
            _add(merged, more)
            pod_cpu, pod_memory = nonzero_requests(more)
            pods += 1
            cpu += pod_cpu
            memory += pod_memory
        return NodeUsage(requested=merged, pods=pods, nonzero_cpu=cpu, nonzero_memory=memory)

    def minus(self, requests: Mapping[str, int]) -> NodeUsage:
        """The usage without one pod again (never below zero)."""
        remaining = {
            key: max(0, value - requests.get(key, 0)) for key, value in self.requested.items()
        }
        cpu, memory = nonzero_requests(requests)
        return NodeUsage(
            requested=remaining,
            pods=max(0, self.pods - 1),
            nonzero_cpu=max(0, self.nonzero_cpu - cpu),
            nonzero_memory=max(0, self.nonzero_memory - memory),
        )


#: kube-scheduler's scoring defaults for a pod that requests no cpu / memory
#: (``schedutil.DefaultMilliCPURequest``, ``DefaultMemoryRequest``).
DEFAULT_MILLI_CPU: Final = 100
DEFAULT_MEMORY: Final = 200 * 1024 * 1024


def nonzero_requests(requests: Mapping[str, int]) -> tuple[int, int]:
    """(millicores, bytes) as kube-scheduler's resource scoring counts a pod: a resource the
    pod does not request counts as the default (an explicit 0 stays 0)."""
    return requests.get("cpu", DEFAULT_MILLI_CPU), requests.get("memory", DEFAULT_MEMORY)


def resource_utilisation(
    allocatable: Mapping[str, int], usage: NodeUsage, requests: Mapping[str, int]
) -> Fraction:
    """The node-axis score of a pod that uses no devices: the mean over cpu and memory (those
    the node reports) of (requested + the pod's request) / allocatable, with
    :func:`nonzero_requests` -- kube-scheduler's ``MostAllocated`` under node binpack and, as an
    order, the reverse of its ``LeastAllocated`` under node spread."""
    cpu, memory = nonzero_requests(requests)
    total = Fraction(0)
    dims = 0
    for used, want, have in (
        (usage.nonzero_cpu, cpu, allocatable.get("cpu", 0)),
        (usage.nonzero_memory, memory, allocatable.get("memory", 0)),
    ):
        if have > 0:
            total += Fraction(min(used + want, have), have)
            dims += 1
    return total / dims if dims else Fraction(0)


def _amount_of(resource: str, quantity: Quantity) -> int:
    nanos = quantity.nanos
    if resource in _MILLI_RESOURCES:
        return -(-nanos // 10**6)
    return -(-nanos // 10**9)


def node_allocatable(node: Node) -> dict[str, int]:
    """The node's allocatable resources in the filter's integer units (cpu in millicores);
    compute once per node and pass to :func:`filter_node`."""
    return {name: _amount_of(name, q) for name, q in node.allocatable.items()}


def untolerated_taint(facts: PodSchedulingFacts, node: Node) -> NodeTaint | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate (not-Ready and
    unschedulable nodes count as carrying the lifecycle controller's taints)."""
    taints: Sequence[NodeTaint] = node.taints
    if not node.ready and not any(t.key == NOT_READY_TAINT for t in taints):
        taints = (*taints, NodeTaint(key=NOT_READY_TAINT, effect="NoSchedule"))
    for taint in taints:
        if taint.effect in _FILTERING_EFFECTS and not facts.tolerates(taint):
            return taint
    return None


def filter_node(
    facts: PodSchedulingFacts,
    node: Node,
    usage: NodeUsage,
    *,
    dra_resources: Collection[str] = (),
    allocatable: Mapping[str, int] | None = None,
    ports: PortSet | None = None,
) -> str | None:
    """None if the pod may run on ``node`` (GPUs aside), else the kube-scheduler reason.
    ``allocatable``: :func:`node_allocatable` of the node, when the caller keeps it;
    ``ports``: the host ports the pods on the node use."""
    if allocatable is None:
        allocatable = node_allocatable(node)
    if node.unschedulable and not facts.tolerates(
        NodeTaint(key=UNSCHEDULABLE_TAINT, effect="NoSchedule")
    ):
        return REASON_UNSCHEDULABLE
    taint = untolerated_taint(facts, node)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    if any(node.labels.get(k) != v for k, v in facts.node_selector.items()):
        return REASON_AFFINITY
    if facts.required_affinity is not None and not node_selector_matches(
        facts.required_affinity, node, f"pod {facts.name} node affinity"
    ):
        return REASON_AFFINITY
    if facts.host_ports and ports and ports.conflicts(facts.host_ports):
        return REASON_PORTS
    pods_allowed = allocatable.get("pods")
    if pods_allowed is not None and usage.pods + 1 > pods_allowed:
        return REASON_TOO_MANY_PODS
    for resource in sorted(facts.requests):
        want = facts.requests[resource]
        if want <= 0 or resource in dra_resources:
            continue
        have = allocatable.get(resource)
        if have is None:
            if resource in ("cpu", "memory", "ephemeral-storage"):
                continue  # a node that does not report it is not limited by it
            return f"Insufficient {resource}"
        if usage.requested.get(resource, 0) + want > have:
            return f"Insufficient {resource}"
    return None


def unschedulable_message(total_nodes: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: <count> <reason>, ....``"""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{total_nodes} nodes are available: {', '.join(parts)}."
