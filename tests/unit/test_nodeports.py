"""NodePorts (driver.scheduling.nodeports), table-driven against kube-scheduler's rule:
``HostPortInfo.CheckConflict`` (an empty host IP is 0.0.0.0, an empty protocol TCP; 0.0.0.0
conflicts with every address of the same protocol and port) and ``util.GetHostPorts``
(containers and restartable init containers, ``hostPort > 0`` only)."""

from __future__ import annotations

import pytest

from driver.api.errors import ManifestError
from driver.scheduling.nodefit import NodeUsage, PodSchedulingFacts, filter_node
from driver.scheduling.nodeports import REASON_PORTS, HostPort, PortSet, host_ports
from tests.unit.builders import node, to_node
from tests.unit.pods import pod

ANY = "0.0.0.0"

CONFLICTS = [
    # (used, wanted, conflict) -- cases of upstream's host_ports_test.go TestHostPortInfo
    ([HostPort(ANY, "TCP", 80)], [HostPort(ANY, "TCP", 80)], True),
    ([HostPort(ANY, "TCP", 80)], [HostPort(ANY, "UDP", 80)], False),
    ([HostPort(ANY, "TCP", 80)], [HostPort("127.0.0.1", "TCP", 80)], True),
    ([HostPort("127.0.0.1", "TCP", 80)], [HostPort(ANY, "TCP", 80)], True),
    ([HostPort("127.0.0.1", "TCP", 80)], [HostPort("127.0.0.2", "TCP", 80)], False),
    ([HostPort("127.0.0.1", "TCP", 80)], [HostPort("127.0.0.1", "TCP", 8080)], False),
    ([HostPort("127.0.0.1", "SCTP", 80)], [HostPort("127.0.0.1", "SCTP", 80)], True),
    ([], [HostPort(ANY, "TCP", 80)], False),
]


@pytest.mark.parametrize(("used", "wanted", "conflict"), CONFLICTS)
def test_conflicts(used: list[HostPort], wanted: list[HostPort], conflict: bool) -> None:
    ports = PortSet()
    ports.add(used)
    assert ports.conflicts(wanted) is conflict


def test_ports_are_counted_per_pod() -> None:
    """Two pods of other schedulers may hold the same port (the kubelet fails the second);
    removing one leaves the port used."""
    ports = PortSet()
    ports.add([HostPort(ANY, "TCP", 80)])
    ports.add([HostPort(ANY, "TCP", 80)])
    ports.remove([HostPort(ANY, "TCP", 80)])
    assert ports.conflicts([HostPort("10.0.0.1", "TCP", 80)])
    ports.remove([HostPort(ANY, "TCP", 80)])
    assert not ports
    assert not ports.conflicts([HostPort("10.0.0.1", "TCP", 80)])


def test_host_ports_of_a_pod() -> None:
    raw = pod("p").port(8080).port(53, protocol="UDP", ip="10.0.0.1").sidecar_port(9090).json()
    raw["spec"]["initContainers"].append(
        {"name": "init", "image": "busybox", "ports": [{"containerPort": 1, "hostPort": 1}]}
    )
    raw["spec"]["containers"][0]["ports"].append({"containerPort": 7000})  # no host port
    assert host_ports(raw) == (
        HostPort(ANY, "TCP", 8080),
        HostPort(ANY, "TCP", 9090),
        HostPort("10.0.0.1", "UDP", 53),
    )


@pytest.mark.parametrize(
    ("port", "message"),
    [
        ({"containerPort": 1, "hostPort": 70000}, "hostPort must be an integer in 1..65535"),
        ({"containerPort": 1, "hostPort": 80, "protocol": "ICMP"}, "'ICMP' is not one of"),
    ],
)
def test_bad_ports_are_refused(port: dict[str, object], message: str) -> None:
    raw = pod("p").json()
    raw["spec"]["containers"][0]["ports"] = [port]
    with pytest.raises(ManifestError, match=message):
        host_ports(raw, "pod default/p")


def test_the_filter_reports_ports_after_node_affinity_and_before_resources() -> None:
    """kube-scheduler's filter order: NodeAffinity, NodePorts, NodeResourcesFit."""
    used = PortSet()
    used.add([HostPort(ANY, "TCP", 8080)])
    tight = to_node(node("n", labels={"zone": "a"}, allocatable={"cpu": "1", "pods": "10"}))
    wants = pod("p").port(8080).requests(cpu="2")
    facts = PodSchedulingFacts.from_pod(wants.json())
    assert filter_node(facts, tight, NodeUsage(), ports=used) == REASON_PORTS
    elsewhere = PodSchedulingFacts.from_pod(wants.node_selector(zone="b").json())
    assert filter_node(elsewhere, tight, NodeUsage(), ports=used) == (
        "node(s) didn't match Pod's node affinity/selector"
    )
    free = PodSchedulingFacts.from_pod(pod("q").port(9090).requests(cpu="2").json())
    assert filter_node(free, tight, NodeUsage(), ports=used) == "Insufficient cpu"
