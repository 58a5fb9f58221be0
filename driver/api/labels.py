"""Label selectors (``metav1.LabelSelector``): the one implementation, for every reader:
kube-scheduler's pod affinity terms, topology spread constraints and the default spreading's
owner selectors, a claim's PV selector and a storage capacity's node topology (the volume
rules), a workload's selector (the simulator) and the admission step's namespace selector.

Semantics are apimachinery's ``LabelSelectorAsSelector``:

* a missing (null) selector selects nothing (:data:`NOTHING`); an empty one (``{}``) selects
  everything;
* ``matchLabels: {k: v}`` is the requirement ``k In (v)``; ``matchExpressions`` take ``In``,
  ``NotIn``, ``Exists`` and ``DoesNotExist``; all requirements must hold;
* ``NotIn`` and ``DoesNotExist`` hold for an object that lacks the label;
* ``In``/``NotIn`` need at least one value, ``Exists``/``DoesNotExist`` take none; another
  operator is an error (:class:`~driver.api.errors.ManifestError`, naming where).

A :class:`LabelSelector` is parsed once, immutable and hashable (equal selectors are equal
keys, however their requirements were ordered or repeated, so merging ``matchLabelKeys`` into a
selector the API server already merged changes nothing). :attr:`LabelSelector.anchor` names a
label every selected object carries, so callers can index selectors by it.
:func:`label_selector_matches` parses and matches a raw selector in one call. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from driver.api.errors import ManifestError

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True, order=True)
class Requirement:
    """One requirement on one label key."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()  # sorted, without duplicates

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        operator = self.operator
        if operator == "In":
            return value is not None and value in self.values
        if operator == "NotIn":
            return value is None or value not in self.values
        if operator == "Exists":
            return value is not None
        return value is None


def requirement(
    key: str, operator: str, values: Iterable[str] = (), where: str = ""
) -> Requirement:
    """A checked :class:`Requirement` (ManifestError naming ``where`` when it is not valid)."""
    if operator not in _OPERATORS:
        raise ManifestError(
            f"{where}: unknown label selector operator {operator!r} "
            f"(allowed: {', '.join(_OPERATORS)})"
        )
    if not isinstance(key, str) or not key:
        raise ManifestError(f"{where}: a label selector requirement needs a key")
    listed = tuple(sorted({str(v) for v in values}))
    if operator in ("In", "NotIn") and not listed:
        raise ManifestError(f"{where}: operator {operator} on {key!r} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and listed:
        raise ManifestError(f"{where}: operator {operator} on {key!r} takes no values")
    return Requirement(key, operator, listed)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed label selector (see the module docstring). ``nothing``: the null selector."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    @classmethod
    def of(cls, requirements: Iterable[Requirement]) -> LabelSelector:
        """The selector of these requirements (sorted and deduplicated: a canonical key)."""
        return cls(tuple(sorted(set(requirements))))

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LabelSelector:
        """``labels.Set(m).AsSelector()``: every label must equal (an empty map selects all)."""
        return cls.of(Requirement(str(k), "In", (str(v),)) for k, v in labels.items())

    @classmethod
    def from_api(cls, raw: Any, where: str) -> LabelSelector:
        """Parse a ``metav1.LabelSelector`` (None: :data:`NOTHING`)."""
        if raw is None:
            return NOTHING
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: a label selector must be an object")
        out: list[Requirement] = []
        match_labels = raw.get("matchLabels") or {}
        if not isinstance(match_labels, Mapping):
            raise ManifestError(f"{where}: matchLabels must be an object")
        for key, value in match_labels.items():
            out.append(requirement(str(key), "In", (str(value),), where))
        for i, expression in enumerate(raw.get("matchExpressions") or ()):
            if not isinstance(expression, Mapping):
                raise ManifestError(f"{where}: matchExpressions[{i}] must be an object")
            values = expression.get("values") or ()
            if isinstance(values, str) or not isinstance(values, Iterable):
                raise ManifestError(f"{where}: matchExpressions[{i}].values must be a list")
            out.append(
                requirement(
                    str(expression.get("key") or ""),
                    str(expression.get("operator")),
                    values,
                    f"{where}: matchExpressions[{i}]",
                )
            )
        return cls.of(out)

    @property
    def empty(self) -> bool:
        """Selects everything (``labels.Selector.Empty``)."""
        return not self.nothing and not self.requirements

    @property
    def anchor(self) -> tuple[str, str] | None:
        """A label (key, value) that every selected object carries, if the selector names one
        (an ``In`` requirement with a single value)."""
        for r in self.requirements:
            if r.operator == "In" and len(r.values) == 1:
                return r.key, r.values[0]
        return None

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        for r in self.requirements:  # noqa: SIM110 - a loop is the fastest form: a hot path
            if not r.matches(labels):
                return False
        return True

    def merged(self, extra: Iterable[Requirement]) -> LabelSelector:
        """This selector with more requirements ANDed in (a null selector stays null)."""
        if self.nothing:
            return self
        return LabelSelector.of((*self.requirements, *extra))


NOTHING: Final = LabelSelector(nothing=True)
EVERYTHING: Final = LabelSelector()


def label_selector_matches(
    selector: Mapping[str, Any], labels: Mapping[str, str], where: str = "labelSelector"
) -> bool:
    """Whether the raw ``metav1.LabelSelector`` ``selector`` selects an object with ``labels``
    (parsed on each call: for selectors read once)."""
    return LabelSelector.from_api(selector, where).matches(labels)
