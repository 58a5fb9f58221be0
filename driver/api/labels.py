"""metav1 ``LabelSelector`` matching, on raw JSON.

Contract: :func:`label_selector_matches` implements apimachinery's ``LabelSelectorAsSelector``
semantics: ``matchLabels`` and every ``matchExpressions`` requirement are ANDed; an empty
selector (``{}``) matches everything. Operators: ``In`` and ``NotIn`` (``NotIn`` also holds
when the key is absent), ``Exists``, ``DoesNotExist``. A malformed selector (unknown operator,
``In``/``NotIn`` without values, values given to ``Exists``/``DoesNotExist``) is a
:class:`~driver.api.errors.ManifestError`, as upstream refuses to convert it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from driver.api.errors import ManifestError


def label_selector_matches(
    selector: Mapping[str, Any], labels: Mapping[str, str], where: str = "labelSelector"
) -> bool:
    """Whether the ``metav1.LabelSelector`` ``selector`` selects an object with ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(str(key)) != str(value):
            return False
    for requirement in selector.get("matchExpressions") or ():
        key = str(requirement.get("key") or "")
        operator = requirement.get("operator")
        values = [str(v) for v in requirement.get("values") or ()]
        if operator in ("In", "NotIn"):
            if not values:
                raise ManifestError(f"{where}: {operator} on {key!r} needs values")
            present = key in labels and labels[key] in values
            if present != (operator == "In"):
                return False
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                raise ManifestError(f"{where}: {operator} on {key!r} takes no values")
            if (key in labels) != (operator == "Exists"):
                return False
        else:
            raise ManifestError(f"{where}: unsupported label selector operator {operator!r}")
    return True
