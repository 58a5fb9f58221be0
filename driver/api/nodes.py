"""Nodes as the allocator and the decision core see them, and core/v1 NodeSelector matching.

Contract:

* :meth:`Node.from_api` converts a raw ``v1.Node`` once; it never mutates its input and raises
  :class:`~driver.api.errors.ManifestError` for malformed objects.
* :func:`node_selector_matches` implements upstream ``NodeSelector`` semantics: terms are ORed;
  within a term every ``matchExpressions`` and ``matchFields`` requirement must hold (ANDed);
  a term with no requirements matches nothing; a selector with no terms matches nothing.
  Operators: ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt`` (integers).
  ``matchFields`` supports ``metadata.name`` with ``In`` / ``NotIn`` only, as upstream.
  An unknown operator or field is a :class:`~driver.api.errors.ManifestError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.api.errors import ManifestError, QuantityError
from driver.api.ids import NodeName
from driver.api.model import JSON
from driver.api.quantity import Quantity


@dataclass(frozen=True, slots=True)
class NodeTaint:
    """A core/v1 node taint (``NoSchedule`` | ``PreferNoSchedule`` | ``NoExecute``)."""

    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class Node:
    """The parts of a ``v1.Node`` that scheduling reads."""

    name: NodeName
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[NodeTaint, ...] = ()
    allocatable: Mapping[str, Quantity] = field(default_factory=dict)
    capacity: Mapping[str, Quantity] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Node:
        if not isinstance(raw, Mapping):
            raise ManifestError("Node: must be an object")
        meta = raw.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError("Node: metadata.name is required")
        where = f"Node {name}"
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        try:
            taints = tuple(
                NodeTaint(
                    key=str(t["key"]), effect=str(t["effect"]), value=str(t.get("value") or "")
                )
                for t in spec.get("taints") or ()
            )
            allocatable = {
                str(k): Quantity.of(v) for k, v in (status.get("allocatable") or {}).items()
            }
            capacity = {str(k): Quantity.of(v) for k, v in (status.get("capacity") or {}).items()}
        except (KeyError, TypeError, AttributeError, QuantityError) as exc:
            raise ManifestError(f"{where}: malformed ({exc})") from exc
        conditions = status.get("conditions")
        ready = True
        if conditions:
            ready = any(
                isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in conditions
            )
        return cls(
            name=NodeName(name),
            uid=str(meta.get("uid") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            taints=taints,
            allocatable=allocatable,
            capacity=capacity,
            unschedulable=bool(spec.get("unschedulable")),
            ready=ready,
        )


def _requirement_matches(req: Mapping[str, Any], value: str | None, where: str) -> bool:
    operator = req.get("operator")
    values: Sequence[str] = req.get("values") or ()
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    raise ManifestError(f"{where}: unsupported node selector operator {operator!r}")


def _term_matches(term: Mapping[str, Any], node: Node, where: str) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for req in expressions:
        if not _requirement_matches(req, node.labels.get(req.get("key", "")), where):
            return False
    for req in fields:
        if req.get("key") != "metadata.name":
            raise ManifestError(f"{where}: unsupported matchFields key {req.get('key')!r}")
        if req.get("operator") not in ("In", "NotIn"):
            raise ManifestError(
                f"{where}: matchFields supports In and NotIn, not {req.get('operator')!r}"
            )
        if not _requirement_matches(req, node.name, where):
            return False
    return True


def node_selector_matches(
    selector: Mapping[str, Any], node: Node, where: str = "nodeSelector"
) -> bool:
    """Whether a core/v1 ``NodeSelector`` (JSON) selects ``node``; terms are ORed."""
    terms = selector.get("nodeSelectorTerms") or ()
    return any(_term_matches(term, node, where) for term in terms)


def node_local_selector(node_name: str) -> JSON:
    """The selector upstream writes for node-local allocations: one term, one field."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }
