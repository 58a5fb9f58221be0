"""events.k8s.io/v1 Events are a view of core/v1 Events, as in the real API server: one storage,
converted field by field at the edge (``k8s.io/kubernetes/pkg/apis/events/v1`` conversion).

===========================  =====================
events.k8s.io/v1             core/v1
===========================  =====================
``regarding``                ``involvedObject``
``note``                     ``message``
``reportingController``      ``reportingComponent``
``deprecatedSource``         ``source``
``deprecatedFirstTimestamp`` ``firstTimestamp``
``deprecatedLastTimestamp``  ``lastTimestamp``
``deprecatedCount``          ``count``
===========================  =====================

Every other field (metadata, ``eventTime``, ``series``, ``action``, ``reason``, ``related``,
``reportingInstance``, ``type``) has the same name and shape. Pure functions returning new
objects.
"""

from __future__ import annotations

from typing import Any, Final

from tests.emulator.errors import FieldError

_RENAMES: Final = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_TO_CORE: Final = dict(_RENAMES)
_TO_V1: Final = {core: v1 for v1, core in _RENAMES}


def to_core(event: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as the core/v1 Event the server stores."""
    out = {_TO_CORE.get(key, key): value for key, value in event.items()}
    out["apiVersion"] = "v1"
    out["kind"] = "Event"
    out.setdefault("involvedObject", {})
    return out


def to_v1(event: dict[str, Any]) -> dict[str, Any]:
    """A stored core/v1 Event as events.k8s.io/v1 shows it."""
    out = {_TO_V1.get(key, key): value for key, value in event.items()}
    if out.get("regarding") == {}:
        del out["regarding"]
    # eventTime is a non-pointer MicroTime without omitempty: a core Event without one shows
    # "eventTime": null (which the Python client's EventsV1Event model refuses, as it does
    # against a real server)
    out.setdefault("eventTime", None)
    if "apiVersion" in event:
        out["apiVersion"] = "events.k8s.io/v1"
    if "kind" in event:
        out["kind"] = "Event"
    return out


def v1_errors(event: dict[str, Any]) -> list[FieldError]:
    """events.k8s.io/v1 create rules the schema does not express."""
    errors = [
        FieldError(required, "Required value", "")
        for required in (
            "eventTime",
            "reportingController",
            "reportingInstance",
            "action",
            "reason",
        )
        if not event.get(required)
    ]
    if event.get("type") not in {"Normal", "Warning"}:
        errors.append(
            FieldError(
                "type",
                "Unsupported value",
                'supported values: "Normal", "Warning"',
                event.get("type"),
            )
        )
    note = event.get("note")
    if isinstance(note, str) and len(note) > 1024:
        errors.append(FieldError("note", "Too long", "may not be more than 1024 bytes"))
    return errors
