"""What the API server and the disruption controller would add to the simulator's input: a
pod's priority from its PriorityClass, and a PodDisruptionBudget's ``disruptionsAllowed``.

* :meth:`PriorityClasses.admit` resolves ``spec.priority`` and ``spec.preemptionPolicy`` as
  the Priority admission plugin does (``plugin/pkg/admission/priority``): a pod that already
  has ``spec.priority`` keeps it (it was admitted; a class changed or deleted later changes
  nothing); otherwise its ``priorityClassName`` gives the value and policy, a name no class has
  is refused (``no PriorityClass with name ... was found``), and without a name the
  ``globalDefault`` class applies (the lowest value when several claim it), else priority 0.
  The built-in ``system-cluster-critical`` (2000000000) and ``system-node-critical``
  (2000001000) classes exist without being given.
* :func:`budget_from_api` reads a budget; one without ``status.disruptionsAllowed`` (written
  by hand rather than read from a cluster) gets it computed as the disruption controller
  would, from the running pods of the input that it selects, all counted healthy: desired
  healthy is ``minAvailable`` (a percentage of the selected pods, rounded up) or the selected
  pods less ``maxUnavailable`` (a percentage rounded up); allowed is healthy less desired, at
  least 0. (Upstream takes the expected count for percentages and ``maxUnavailable`` from the
  pods' controllers' scale; here the selected pods stand for it.)

Pure; errors are :class:`~driver.api.errors.ManifestError` naming the object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.labels import LabelSelector
from driver.scheduling.preemption import DisruptionBudget

JSON = dict[str, Any]

#: The classes every API server creates (``scheduling.SystemCriticalPriority`` and + 1000).
BUILTIN: Final[Mapping[str, int]] = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}
PREEMPT_LOWER: Final = "PreemptLowerPriority"


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    policy: str
    default: bool


class PriorityClasses:
    """The PriorityClasses of one run (see the module docstring)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.by_name: dict[str, PriorityClass] = {
            name: PriorityClass(name, value, PREEMPT_LOWER, default=False)
            for name, value in BUILTIN.items()
        }
        for obj in objects:
            name = str((obj.get("metadata") or {}).get("name"))
            value = obj.get("value")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ManifestError(f"PriorityClass {name}: value must be an integer")
            self.by_name[name] = PriorityClass(
                name,
                value,
                str(obj.get("preemptionPolicy") or PREEMPT_LOWER),
                default=bool(obj.get("globalDefault")),
            )
        defaults = [c for c in self.by_name.values() if c.default]
        self.default = min(defaults, key=lambda c: (c.value, c.name)) if defaults else None

    def admit(self, pod: JSON) -> JSON:
        """``pod`` with ``spec.priority`` (and ``preemptionPolicy``) resolved; the same
        object when it already has a priority."""
        spec = pod.get("spec") or {}
        if spec.get("priority") is not None:
            return pod
        name = spec.get("priorityClassName")
        if name:
            found = self.by_name.get(str(name))
            if found is None:
                meta = pod.get("metadata") or {}
                raise ManifestError(
                    f"Pod {meta.get('namespace') or 'default'}/{meta.get('name')}: no "
                    f"PriorityClass with name {name} was found (the API server would refuse it)"
                )
        else:
            found = self.default
        out = {**pod, "spec": {**spec}}
        if found is None:
            out["spec"]["priority"] = 0
            return out
        out["spec"]["priorityClassName"] = found.name
        out["spec"]["priority"] = found.value
        out["spec"].setdefault("preemptionPolicy", found.policy)
        return out


def _scaled(value: Any, total: int, where: str) -> int:
    """An int-or-percent against ``total``, a percentage rounded up."""
    if isinstance(value, bool):
        raise ManifestError(f"{where}: must be an integer or a percentage")
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%") and text[:-1].isdigit():
        return math.ceil(int(text[:-1]) * total / 100)
    if text.isdigit():
        return int(text)
    raise ManifestError(f"{where}: {value!r} is not an integer or a percentage")


def budget_from_api(
    raw: Mapping[str, Any], running: Sequence[Mapping[str, Any]]
) -> DisruptionBudget:
    """The budget as preemption reads it (``disruptionsAllowed`` computed when not given)."""
    status = raw.get("status") or {}
    if "disruptionsAllowed" in status:
        return DisruptionBudget.from_api(raw)
    meta = raw.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    where = f"PodDisruptionBudget {namespace}/{meta.get('name')}"
    spec = raw.get("spec") or {}
    selected = 0
    if spec.get("selector") is not None:
        selector = LabelSelector.from_api(spec["selector"], f"{where}: spec.selector")
        selected = sum(
            1
            for p in running
            if str((p.get("metadata") or {}).get("namespace") or "default") == namespace
            and selector.matches((p.get("metadata") or {}).get("labels") or {})
        )
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], selected, f"{where}: spec.minAvailable")
    elif spec.get("maxUnavailable") is not None:
        desired = selected - _scaled(
            spec["maxUnavailable"], selected, f"{where}: spec.maxUnavailable"
        )
    else:
        desired = 0
    return DisruptionBudget.from_api(
        {**raw, "status": {"disruptionsAllowed": max(0, selected - desired)}}
    )
