"""What both long-running components share: the thin async Kubernetes API access, and the
runtime pieces around it.

``kubeletplugin`` and ``controller`` talk to the API server with raw JSON over ``aiohttp``
on their process's one asyncio loop; this package is that client, once, and the pieces both
processes run it with:

* :mod:`kubeapi.endpoint`: where the API server is and how to authenticate (a kubeconfig, or
  the in-cluster service account), resolved with the official loader;
* :mod:`kubeapi.resources`: :class:`Resource` (group, version, plural, scope: its URL path)
  and the resources biaxial touches;
* :mod:`kubeapi.codec`: JSON text to data and back at any nesting depth the API server
  accepts (an iterative fallback where ``json`` recurses too deep);
* :mod:`kubeapi.client`: :class:`Client`, the request core (token bucket, rotating token,
  error mapping), list with pagination, chunked watch, create/replace/patch/delete;
  :func:`~kubeapi.client.background` marks requests that yield to all others at the bucket;
* :mod:`kubeapi.events`: :func:`~kubeapi.events.event_body`, the core/v1 Event either
  component records about an object;
* :mod:`kubeapi.tasks`: :class:`TaskGuard`, the one guard every background task of either
  process is started through (a crash is logged and stops the process; stop cancels in
  reverse start order).

Imports ``driver`` (for :mod:`driver.api.errors`); never ``kubeletplugin``, ``controller`` or
``biaxial``. The components build their own operations on :class:`Client`.
"""

from kubeapi.client import (
    JSON_PATCH,
    JSON_TYPE,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Client,
    ListResult,
    PatchType,
    TokenBucket,
    WatchEvent,
    background,
)
from kubeapi.endpoint import Endpoint
from kubeapi.resources import (
    DEVICE_CLASSES,
    EVENTS,
    JSON,
    LEASES,
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    REPLICATION_CONTROLLERS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SERVICES,
    STATEFUL_SETS,
    VOLUME_RESOURCES,
    Resource,
    meta,
)

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "JSON",
    "JSON_PATCH",
    "JSON_TYPE",
    "LEASES",
    "MERGE_PATCH",
    "NAMESPACES",
    "NODES",
    "PERSISTENT_VOLUMES",
    "PERSISTENT_VOLUME_CLAIMS",
    "PODS",
    "POD_DISRUPTION_BUDGETS",
    "REPLICATION_CONTROLLERS",
    "REPLICA_SETS",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "SERVICES",
    "STATEFUL_SETS",
    "STRATEGIC_PATCH",
    "VOLUME_RESOURCES",
    "Client",
    "Endpoint",
    "ListResult",
    "PatchType",
    "Resource",
    "TokenBucket",
    "WatchEvent",
    "background",
    "meta",
]
