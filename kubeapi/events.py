"""core/v1 Events as both components write them: one body builder, no I/O.

:func:`event_body` gives the Event a component records about one object (a Pod the controller
could not place, the Node whose checkpoint the kubelet plugin cannot read): the object as
``involvedObject``, ``source.component`` / ``reportingComponent`` and ``reportingInstance``,
first and last timestamp now, count 1, the message cut to 1024 characters, and a unique name
``<object name>.<16 hex>`` within the 253 characters of a name (as client-go's recorder names
them). Pure apart from the clock and the random name suffix.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Final

from kubeapi.resources import JSON

MAX_MESSAGE: Final = 1024
MAX_INSTANCE: Final = 128


def now_rfc3339(micro: bool = False) -> str:
    now = dt.datetime.now(dt.UTC)
    if micro:
        return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    involved: JSON,
    *,
    namespace: str,
    event_type: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
) -> JSON:
    """An Event about ``involved`` (``{"apiVersion", "kind", "name"[, "namespace", "uid"]}``),
    stored in ``namespace``."""
    stamp = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{str(involved['name'])[:236]}.{uuid.uuid4().hex[:16]}",
            "namespace": namespace,
        },
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance[:MAX_INSTANCE],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
