"""core/v1 Events as both components write them: one body builder, no I/O.

:func:`event_body` gives the Event a component records about one object (a Pod the controller
could not place, the Node whose checkpoint the kubelet plugin cannot read): the object as
``involvedObject``, ``source.component`` / ``reportingComponent`` and ``reportingInstance``,
first and last timestamp now, count 1, the message cut to 1024 characters, and a unique name
``<object name>.<16 hex>`` within the 253 characters of a name (as client-go's recorder names
them). Pure apart from the clock and the random name suffix.

An Event per bound pod is written on the controller's hot path, so the body is built cheaply:
the name's suffix is 8 random bytes in hex (``uuid.uuid4()`` built a UUID object for them, 3 us
against 0.7), and the timestamp's text is made once per second (``datetime.now`` and
``strftime`` were 3 us a call).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Final

from kubeapi.resources import JSON

MAX_MESSAGE: Final = 1024
MAX_INSTANCE: Final = 128


#: The last whole second :func:`now_rfc3339` wrote, and its text.
_second: tuple[int, str] = (-1, "")


def now_rfc3339(micro: bool = False) -> str:
    """Now in UTC, RFC 3339, to the second (``micro``: to the microsecond)."""
    global _second  # noqa: PLW0603 - a one-entry memo of the text per second
    if micro:
        return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    whole = int(time.time())
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(whole)))
    return _second[1]


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
            "name": f"{str(involved['name'])[:236]}.{os.urandom(8).hex()}",
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
