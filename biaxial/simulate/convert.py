"""``resource.k8s.io`` objects of the older served versions, converted to v1 as the API server
converts them (kubernetes ``pkg/apis/resource/v1beta1/conversion.go``; v1beta2 has the v1
shapes).

* ``v1beta2`` -> ``v1``: the same fields; only ``apiVersion`` changes.
* ``v1beta1`` -> ``v1``: a ``DeviceRequest`` that sets any of ``deviceClassName``,
  ``selectors``, ``allocationMode``, ``count``, ``adminAccess``, ``tolerations``,
  ``capacity`` gets them moved under ``exactly`` (``firstAvailable`` stays); a slice's device
  ``basic`` wrapper is flattened into the device; ``spec.nodeName: ""`` and
  ``spec.allNodes: false`` become unset.
* ``v1alpha1`` .. ``v1alpha3``: not served by the Kubernetes versions biaxial supports; refused
  by name (:class:`~driver.api.errors.ManifestError`).

Pure: the input is never mutated; the result is a new object.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from driver.api.errors import ManifestError

GROUP: Final = "resource.k8s.io"
V1: Final = f"{GROUP}/v1"
SERVED: Final = (V1, f"{GROUP}/v1beta2", f"{GROUP}/v1beta1")
_MAIN_REQUEST_FIELDS: Final = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)

JSON = dict[str, Any]


def needs_conversion(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a ``resource.k8s.io`` object in another version than v1."""
    api_version = obj.get("apiVersion")
    return (
        isinstance(api_version, str) and api_version.startswith(f"{GROUP}/") and (api_version != V1)
    )


def _is_set(key: str, value: Any) -> bool:
    """Upstream ``hasAnyMainRequestFieldsSet``: strings non-empty, count non-zero, the
    pointers and lists non-nil (an empty list or ``adminAccess: false`` counts)."""
    if value is None:
        return False
    if key in ("deviceClassName", "allocationMode"):
        return bool(value != "")
    if key == "count":
        return bool(value != 0)
    return True


def _request(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return raw
    out = {k: v for k, v in raw.items() if k not in _MAIN_REQUEST_FIELDS}
    if any(_is_set(k, raw.get(k)) for k in _MAIN_REQUEST_FIELDS):
        out["exactly"] = {k: raw[k] for k in _MAIN_REQUEST_FIELDS if raw.get(k) is not None}
    return out


def _claim_spec(spec: Any) -> Any:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if isinstance(devices, dict) and isinstance(devices.get("requests"), list):
        devices["requests"] = [_request(r) for r in devices["requests"]]
    return spec


def _device(raw: Any) -> Any:
    if not isinstance(raw, dict) or "basic" not in raw:
        return raw
    out = {k: v for k, v in raw.items() if k != "basic"}
    basic = raw.get("basic")
    if isinstance(basic, dict):
        out.update(basic)
    return out


def to_v1(obj: Mapping[str, Any], where: str) -> JSON:
    """``obj`` as a ``resource.k8s.io/v1`` object (see the module docstring)."""
    api_version = str(obj.get("apiVersion"))
    kind = obj.get("kind")
    if api_version not in SERVED:
        raise ManifestError(
            f"{where}: {api_version} {kind} is not served by Kubernetes 1.34 or newer "
            f"(biaxial reads {', '.join(SERVED)}); rewrite it for {V1}"
        )
    out: JSON = copy.deepcopy(dict(obj))
    out["apiVersion"] = V1
    if api_version != f"{GROUP}/v1beta1":
        return out
    spec = out.get("spec")
    if kind == "ResourceClaim":
        _claim_spec(spec)
    elif kind == "ResourceClaimTemplate" and isinstance(spec, dict):
        _claim_spec(spec.get("spec"))
    elif kind == "ResourceSlice" and isinstance(spec, dict):
        if spec.get("nodeName") == "":
            del spec["nodeName"]
        if spec.get("allNodes") is False:
            del spec["allNodes"]
        if isinstance(spec.get("devices"), list):
            spec["devices"] = [_device(d) for d in spec["devices"]]
    return out
