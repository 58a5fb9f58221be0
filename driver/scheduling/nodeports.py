"""NodePorts: a pod's host ports must be free on the node, whichever scheduler placed the
pods already there.

As kube-scheduler's NodePorts plugin and its ``HostPortInfo``:

* a pod's host ports are the ``ports`` with ``hostPort > 0`` of its containers and of its
  sidecars (init containers with ``restartPolicy: Always``, which run for the pod's life);
  other init containers do not hold ports (``GetHostPorts``);
* a port is (host IP, protocol, port); an empty host IP is ``0.0.0.0`` and an empty protocol
  ``TCP``;
* a wanted port conflicts with a used one of the same protocol and port when either host IP
  is ``0.0.0.0`` (it binds every address) or both are the same address;
* the node's reason is upstream's ``node(s) didn't have free ports for the requested pod
  ports``.

:class:`PortSet` is one node's used ports, counted so that pods can be added and removed in
any order; :meth:`PortSet.conflicts` is O(wanted ports). Pure otherwise; nothing here mutates
its inputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from driver.api.errors import ManifestError

REASON_PORTS: Final = "node(s) didn't have free ports for the requested pod ports"
BIND_ALL: Final = "0.0.0.0"  # noqa: S104 - upstream's DefaultBindAllHostIP
_PROTOCOLS: Final = frozenset({"TCP", "UDP", "SCTP"})


class HostPort(NamedTuple):
    """One host port a container binds."""

    ip: str
    protocol: str
    port: int


def host_ports(pod: Mapping[str, Any], where: str = "pod") -> tuple[HostPort, ...]:
    """The host ports a pod holds while it runs (see the module docstring), sorted."""
    spec = pod.get("spec") or {}
    containers = [
        c
        for c in spec.get("initContainers") or ()
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    containers += [c for c in spec.get("containers") or () if isinstance(c, Mapping)]
    out: set[HostPort] = set()
    for container in containers:
        for i, port in enumerate(container.get("ports") or ()):
            if not isinstance(port, Mapping):
                raise ManifestError(
                    f"{where} container {container.get('name')!r}: ports[{i}] must be an object"
                )
            number = port.get("hostPort")
            if number is None or number == 0:
                continue
            if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 65536:
                raise ManifestError(
                    f"{where} container {container.get('name')!r}: ports[{i}].hostPort must be "
                    f"an integer in 1..65535, got {number!r}"
                )
            protocol = str(port.get("protocol") or "TCP")
            if protocol not in _PROTOCOLS:
                raise ManifestError(
                    f"{where} container {container.get('name')!r}: ports[{i}].protocol "
                    f"{protocol!r} is not one of TCP, UDP, SCTP"
                )
            out.add(HostPort(str(port.get("hostIP") or BIND_ALL), protocol, number))
    return tuple(sorted(out))


class PortSet:
    """The host ports used on one node, counted per pod that holds them."""

    __slots__ = ("_any", "_exact")

    def __init__(self) -> None:
        self._exact: Counter[HostPort] = Counter()
        self._any: Counter[tuple[str, int]] = Counter()  # (protocol, port) on any address

    def __bool__(self) -> bool:
        return bool(self._exact)

    def add(self, ports: Iterable[HostPort]) -> None:
        for port in ports:
            self._exact[port] += 1
            self._any[port.protocol, port.port] += 1

    def remove(self, ports: Iterable[HostPort]) -> None:
        for port in ports:
            self._exact[port] -= 1
            if self._exact[port] <= 0:
                del self._exact[port]
            pair = (port.protocol, port.port)
            self._any[pair] -= 1
            if self._any[pair] <= 0:
                del self._any[pair]

    def used(self) -> frozenset[HostPort]:
        return frozenset(self._exact)

    def conflicts(self, wanted: Iterable[HostPort]) -> bool:
        """Whether any wanted port is taken (``HostPortInfo.CheckConflict``)."""
        for ip, protocol, port in wanted:
            if ip == BIND_ALL:
                if (protocol, port) in self._any:
                    return True
            elif (
                HostPort(ip, protocol, port) in self._exact
                or HostPort(BIND_ALL, protocol, port) in self._exact
            ):
                return True
        return False
