"""The admission step: unchanged manifests of other GPU schedulers sent to biaxial.

Teams moving to biaxial would otherwise edit every manifest: ``schedulerName: biaxial`` on
each pod, and for KAI's annotation-only sharing (``gpu-fraction``, ``gpu-memory``) also
``nvidia.com/gpu`` on the container KAI designates, because the kubelet gives a container DRA
devices only for an extended resource the container asks for (:mod:`driver.scheduling.bridge`
refuses such a pod with that advice). The chart's opt-in ``MutatingAdmissionPolicy`` makes
those two changes as pods are created; :func:`admit` is the same mutation as a pure function,
which ``biaxial simulate --admission`` applies, the controller's mutating webhook
(:mod:`controller.webhook`, for clusters without the policy) returns as a JSON Patch
(:meth:`Admission.json_patch`), and the table test in
``tests/unit/test_admission.py`` pins (the same table runs against the policy on the real API
server in ``tests/apiserver/test_admission.py``).

The rules, in order (the first that holds leaves the pod untouched):

* the pod's namespace is outside the administrator's label selector;
* the pod is already bound (``spec.nodeName``);
* the pod's scheduler (``default-scheduler`` when unset) is neither biaxial nor one of the
  names the administrator lists (``default-scheduler``, ``hami-scheduler``, ``volcano``,
  ``kai-scheduler``, ...): a pod naming another scheduler is never taken;
* the pod asks for no GPU: no container or init container names one of
  :data:`GPU_RESOURCES`, a name starting with one of :data:`GPU_RESOURCE_PREFIXES` or the
  implicit extended resource of one of biaxial's DeviceClasses in its limits or requests, and
  it carries none of :data:`GPU_ANNOTATIONS`.

Otherwise ``spec.schedulerName`` becomes biaxial's; and when the pod carries ``gpu-fraction``
or ``gpu-memory``, KAI's target container (``gpu-fraction-container-name`` among the
containers, then the init containers; else the first container, KAI's rule) that asks for no
``nvidia.com/gpu`` gets ``nvidia.com/gpu: <gpu-fraction-num-devices, else 1>`` in its limits
and requests. What changed is written to the annotation :data:`NOTE` (``kubectl describe pod``
shows it), e.g. ``schedulerName: default-scheduler -> biaxial; containers[0] (main)
nvidia.com/gpu: 1``.

What admission cannot see: the class of a ``resourceClaimTemplateName`` or
``resourceClaimName`` (a lookup the policy cannot make), so a pod asking for GPUs only through
claims is not taken; such a pod was written for DRA and names its scheduler itself. A
malformed KAI annotation (``gpu-fraction-num-devices: two`` or of more than 18 digits, a
container name the pod does not have) gets no container change: the pod goes to biaxial,
which refuses it with the reason.

Pure: inputs are never mutated; :meth:`Admission.apply` returns a new pod.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from driver.api.labels import LabelSelector
from driver.scheduling import dialects
from driver.scheduling.bridge import (
    GPU_RESOURCE,
    IMPLICIT_PREFIX,
    LEGACY_RESOURCES,
    VOLCANO_NUMBER_RESOURCE,
)

NOTE: Final = dialects.ADMISSION_NOTE
DEFAULT_SCHEDULER: Final = "default-scheduler"
#: Resource names that ask for a GPU: HAMi's and Volcano's vocabularies (``nvidia.com/gpu`` is
#: also the device plugin's, and the extended resource of biaxial's gpu class).
GPU_RESOURCES: Final = frozenset(LEGACY_RESOURCES | {GPU_RESOURCE, VOLCANO_NUMBER_RESOURCE})
#: Prefixes of resource names that ask for a GPU: the device plugin's MIG resources
#: (``nvidia.com/mig-1g.10gb``, also the extended resources of biaxial's MIG classes).
GPU_RESOURCE_PREFIXES: Final = ("nvidia.com/mig-",)
#: The implicit extended resource of any of biaxial's DeviceClasses
#: (``deviceclass.resource.kubernetes.io/gpu.biaxial.dev``) asks for a GPU too.
CLASS_SUFFIX: Final = ".biaxial.dev"
#: Annotations that ask for or shape GPUs (KAI's, HAMi's, Volcano's): a pod with one is taken.
GPU_ANNOTATIONS: Final = frozenset(
    {
        dialects.KAI_FRACTION,
        dialects.KAI_MEMORY,
        dialects.USE_GPUTYPE,
        dialects.NOUSE_GPUTYPE,
        dialects.USE_GPUUUID,
        dialects.NOUSE_GPUUUID,
        dialects.NUMA_BIND,
        dialects.VGPU_MODE,
        dialects.VOLCANO_USE_GPUUUID,
        dialects.VOLCANO_NOUSE_GPUUUID,
        dialects.VOLCANO_VGPU_MODE,
    }
)
_WHOLE: Final = re.compile(r"[0-9]{1,18}")  # an int64, as the policy's CEL int()
Field = Literal["containers", "initContainers"]
_FIELDS: Final[tuple[Field, ...]] = ("containers", "initContainers")


@dataclass(frozen=True, slots=True)
class AdmissionScope:
    """The administrator's choices (chart values ``admission.*``)."""

    namespaces: LabelSelector
    schedulers: frozenset[str]
    scheduler_name: str = "biaxial"

    def takes(self, scheduler: str) -> bool:
        return scheduler == self.scheduler_name or scheduler in self.schedulers


@dataclass(frozen=True, slots=True)
class ContainerResource:
    """``nvidia.com/gpu: count`` added to one container's limits and requests."""

    field: Field
    index: int
    name: str
    count: int

    def note(self) -> str:
        return f"{self.field}[{self.index}] ({self.name}) {GPU_RESOURCE}: {self.count}"


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission changes on one pod (at least one of the two)."""

    scheduler: tuple[str, str] | None  # (from, to)
    container: ContainerResource | None

    def note(self) -> str:
        """The text of the :data:`NOTE` annotation."""
        parts = []
        if self.scheduler is not None:
            parts.append(f"schedulerName: {self.scheduler[0]} -> {self.scheduler[1]}")
        if self.container is not None:
            parts.append(self.container.note())
        return "; ".join(parts)

    def apply(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``pod`` with the changes made and the note written."""
        out = copy.deepcopy(dict(pod))
        spec = out.setdefault("spec", {})
        if self.scheduler is not None:
            spec["schedulerName"] = self.scheduler[1]
        if self.container is not None:
            c = spec[self.container.field][self.container.index]
            resources = c.setdefault("resources", {})
            for part in ("limits", "requests"):
                resources.setdefault(part, {})[GPU_RESOURCE] = str(self.container.count)
        meta = out.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), NOTE: self.note()}
        return out

    def json_patch(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The same changes as an RFC 6902 JSON Patch on ``pod`` (what the mutating webhook
        returns): applied to ``pod`` it gives :meth:`apply`'s result. Only ``add`` operations,
        each on a path whose parent exists in ``pod`` (``add`` on an existing object member
        replaces it, RFC 6902 section 4.1)."""
        ops: list[dict[str, Any]] = []
        if self.scheduler is not None:
            ops.append({"op": "add", "path": "/spec/schedulerName", "value": self.scheduler[1]})
        if self.container is not None:
            c = self.container
            at = f"/spec/{c.field}/{c.index}/resources"
            resources = (pod.get("spec") or {})[c.field][c.index].get("resources")
            count = str(c.count)
            if not isinstance(resources, Mapping):
                value: dict[str, Any] = {
                    "limits": {GPU_RESOURCE: count},
                    "requests": {GPU_RESOURCE: count},
                }
                ops.append({"op": "add", "path": at, "value": value})
            else:
                for part in ("limits", "requests"):
                    if isinstance(resources.get(part), Mapping):
                        path = f"{at}/{part}/{_pointer(GPU_RESOURCE)}"
                        ops.append({"op": "add", "path": path, "value": count})
                    else:
                        ops.append(
                            {"op": "add", "path": f"{at}/{part}", "value": {GPU_RESOURCE: count}}
                        )
        annotations = (pod.get("metadata") or {}).get("annotations")
        if isinstance(annotations, Mapping):
            path = f"/metadata/annotations/{_pointer(NOTE)}"
            ops.append({"op": "add", "path": path, "value": self.note()})
        elif isinstance(pod.get("metadata"), Mapping):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {NOTE: self.note()}})
        else:
            ops.append(
                {"op": "add", "path": "/metadata", "value": {"annotations": {NOTE: self.note()}}}
            )
        return ops


def _pointer(key: str) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def _all_containers(spec: Mapping[str, Any]) -> Iterable[tuple[Field, int, Mapping[str, Any]]]:
    for field in _FIELDS:
        for index, container in enumerate(spec.get(field) or ()):
            if isinstance(container, Mapping):
                yield field, index, container


def _resource_names(container: Mapping[str, Any]) -> set[str]:
    resources = container.get("resources") or {}
    names: set[str] = set()
    for part in ("limits", "requests"):
        names.update(str(k) for k in resources.get(part) or {})
    return names


def _asks_for_gpus(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> bool:
    if any(key in GPU_ANNOTATIONS for key in annotations):
        return True
    for _, _, container in _all_containers(spec):
        for name in _resource_names(container):
            if name in GPU_RESOURCES or name.startswith(GPU_RESOURCE_PREFIXES):
                return True
            if name.startswith(IMPLICIT_PREFIX) and name.endswith(CLASS_SUFFIX):
                return True
    return False


def _kai_container(
    spec: Mapping[str, Any], annotations: Mapping[str, Any]
) -> ContainerResource | None:
    if dialects.KAI_FRACTION not in annotations and dialects.KAI_MEMORY not in annotations:
        return None
    raw = annotations.get(dialects.KAI_NUM_DEVICES, "1")
    if not isinstance(raw, str) or not _WHOLE.fullmatch(raw) or int(raw) == 0:
        return None
    wanted = annotations.get(dialects.KAI_CONTAINER)
    for field, index, container in _all_containers(spec):
        name = container.get("name")
        if wanted is None and (field, index) != ("containers", 0):
            continue
        if wanted is not None and name != wanted:
            continue
        if GPU_RESOURCE in _resource_names(container):
            return None
        return ContainerResource(field, index, str(name), int(raw))
    return None


def admit(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str], scope: AdmissionScope
) -> Admission | None:
    """What admission changes on ``pod`` being created in a namespace with these labels;
    ``None``: the pod is left as it is (see the module docstring for the rules)."""
    if not scope.namespaces.matches(namespace_labels):
        return None
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if spec.get("nodeName"):
        return None
    scheduler = str(spec.get("schedulerName") or DEFAULT_SCHEDULER)
    if not scope.takes(scheduler) or not _asks_for_gpus(spec, annotations):
        return None
    switch = None if scheduler == scope.scheduler_name else (scheduler, scope.scheduler_name)
    container = _kai_container(spec, annotations)
    if switch is None and container is None:
        return None
    return Admission(switch, container)
