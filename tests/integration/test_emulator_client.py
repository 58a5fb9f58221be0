"""The official ``kubernetes`` client (37.x) against the emulator: typed sync APIs for every
kind, ``kubernetes.aio``, ``watch.Watch`` (including resume after 410), the bundled
``SharedInformer``, conflicts, pod binding with ``_preload_content=False`` and ``/status``
writes."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.emulator import Emulator

DRIVER = "gpu.example.com"


def _slice(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"index": {"int": 0}},
                    "capacity": {"memory": {"value": "16Gi"}},
                }
            ],
        },
    }


def _claim(name: str) -> client.ResourceV1ResourceClaim:
    return client.ResourceV1ResourceClaim(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ResourceClaimSpec(
            devices=client.V1DeviceClaim(
                requests=[
                    client.V1DeviceRequest(
                        name="gpu", exactly=client.V1ExactDeviceRequest(device_class_name="gpu")
                    )
                ]
            )
        ),
    )


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="pause:3.10")]),
    )


def test_core_v1_kinds(api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    assert core.read_namespace("team").status.phase == "Active"
    node = core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name="n1", labels={"gpu": "t4"}))
    )
    assert node.metadata.uid
    node.status = client.V1NodeStatus(capacity={"nvidia.com/gpu": "4"})
    patched = core.replace_node_status("n1", node)
    assert patched.status.capacity == {"nvidia.com/gpu": "4"}
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=t4").items] == ["n1"]
    pod = core.create_namespaced_pod("team", _pod("p"))
    assert pod.status.phase == "Pending"
    assert pod.spec.scheduler_name == "default-scheduler"
    event = core.create_namespaced_event(
        "team",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="p."),
            involved_object=client.V1ObjectReference(
                kind="Pod", name="p", namespace="team", uid=pod.metadata.uid
            ),
            reason="Scheduled",
            message="bound",
            type="Normal",
        ),
    )
    listed = core.list_namespaced_event("team", field_selector="involvedObject.name=p")
    assert [e.metadata.name for e in listed.items] == [event.metadata.name]
    core.delete_namespaced_pod("p", "team")
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("p", "team")
    assert missing.value.status == 404


def test_resource_v1_kinds(api_client: Any) -> None:
    resource = client.ResourceV1Api(api_client)
    device_class = resource.create_device_class(
        client.V1DeviceClass(
            metadata=client.V1ObjectMeta(name="gpu"),
            spec=client.V1DeviceClassSpec(
                selectors=[
                    client.V1DeviceSelector(
                        cel=client.V1CELDeviceSelector(expression=f'device.driver == "{DRIVER}"')
                    )
                ]
            ),
        )
    )
    assert device_class.metadata.generation == 1
    created = resource.create_resource_slice(_slice("n1-gpu", "n1"))
    assert created.spec.devices[0].capacity["memory"].value == "16Gi"
    on_node = resource.list_resource_slice(field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in on_node.items] == ["n1-gpu"]
    claim = resource.create_namespaced_resource_claim("default", _claim("c"))
    assert claim.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"
    assert claim.spec.devices.requests[0].exactly.count == 1
    template = resource.create_namespaced_resource_claim_template(
        "default",
        client.V1ResourceClaimTemplate(
            metadata=client.V1ObjectMeta(name="t"),
            spec=client.V1ResourceClaimTemplateSpec(spec=_claim("x").spec),
        ),
    )
    assert template.metadata.name == "t"
    resource.delete_resource_slice("n1-gpu")
    assert resource.list_resource_slice().items == []


def test_coordination_and_events_v1(api_client: Any) -> None:
    leases = client.CoordinationV1Api(api_client)
    lease = leases.create_namespaced_lease(
        "kube-node-lease",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="leader"),
            spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
        ),
    )
    lease.spec.holder_identity = "b"
    renewed = leases.replace_namespaced_lease("leader", "kube-node-lease", lease)
    assert renewed.spec.holder_identity == "b"
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as stale:
        leases.replace_namespaced_lease("leader", "kube-node-lease", lease)
    assert stale.value.status == 409
    events = client.EventsV1Api(api_client)
    created = events.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="e1"),
            # the client sends datetime.isoformat(): whole seconds would lose the six digits
            # MicroTime needs (the real server answers 400), so the time has microseconds
            event_time="2026-11-23T00:00:00.123456Z",
            reporting_controller="biaxial.example.com/controller",
            reporting_instance="c-1",
            action="Allocate",
            reason="Allocated",
            type="Normal",
            note="ok",
            regarding=client.V1ObjectReference(kind="ResourceClaim", name="c", namespace="default"),
        ),
    )
    assert created.reason == "Allocated"
    assert [e.metadata.name for e in events.list_namespaced_event("default").items] == ["e1"]


def test_conflict_and_status_writes(api_client: Any, emulator: Emulator) -> None:
    resource = client.ResourceV1Api(api_client)
    claim = resource.create_namespaced_resource_claim("default", _claim("c"))
    claim.status = client.V1ResourceClaimStatus(
        allocation=client.V1AllocationResult(
            devices=client.V1DeviceAllocationResult(
                results=[
                    client.V1DeviceRequestAllocationResult(
                        request="gpu", driver=DRIVER, pool="n1", device="gpu-0"
                    )
                ]
            )
        )
    )
    allocated = resource.replace_namespaced_resource_claim_status("c", "default", claim)
    assert allocated.status.allocation.devices.results[0].device == "gpu-0"
    with pytest.raises(ApiException) as conflict:
        resource.replace_namespaced_resource_claim_status("c", "default", claim)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    reserved = resource.patch_namespaced_resource_claim_status(
        "c",
        "default",
        {
            "status": {
                "reservedFor": [
                    {"resource": "pods", "name": "p", "uid": "11111111-1111-1111-1111-111111111111"}
                ]
            }
        },
    )
    assert reserved.status.reserved_for[0].name == "p"
    assert (
        emulator.requests_for(method="PATCH")[-1].content_type
        == "application/strategic-merge-patch+json"
    )
    reserved2 = resource.patch_namespaced_resource_claim_status(
        "c",
        "default",
        {
            "status": {
                "reservedFor": [
                    {"resource": "pods", "name": "q", "uid": "22222222-2222-2222-2222-222222222222"}
                ]
            }
        },
    )
    # merged by uid; strategicpatch.normalizeElementOrder puts the new entry first
    assert [r.name for r in reserved2.status.reserved_for] == ["q", "p"]


def test_binding_with_preload_content_false(api_client: Any, emulator: Emulator) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod("default", _pod("p"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"),
        target=client.V1ObjectReference(kind="Node", name="n1"),
    )
    response = core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert response.status == 201
    assert json.loads(response.data)["status"] == "Success"
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n1"
    with pytest.raises(ApiException) as again:
        core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert again.value.status == 409


def test_typed_binding_response_fails_to_parse_as_against_a_real_server(api_client: Any) -> None:
    """The real server answers ``Status`` (201) to a binding; the typed client cannot parse it
    into ``V1Binding``. The emulator reproduces that quirk (the bind itself succeeded)."""
    import pydantic

    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod("default", _pod("p"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"),
        target=client.V1ObjectReference(kind="Node", name="n1"),
    )
    with pytest.raises(pydantic.ValidationError):
        core.create_namespaced_pod_binding("p", "default", body)
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_watch_stream_resumes_after_a_410(api_client: Any, emulator: Emulator) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod("default", _pod("a"))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    emulator.expire_next_watch(resource="pods")
    core.create_namespaced_pod("default", _pod("b"))

    def feed() -> None:
        emulator.wait_for_watches(1, kind="pods")
        core.create_namespaced_pod("default", _pod("c"))

    feeder = threading.Thread(target=feed)
    feeder.start()
    # The first watch (from rv) gets ERROR 410; Watch.stream retries once silently from its
    # last resourceVersion (still rv), then sees b and c.
    for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    feeder.join()
    assert seen == [("ADDED", "b"), ("ADDED", "c")]


def test_watch_stream_raises_on_a_second_410(api_client: Any, emulator: Emulator) -> None:
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_pod("default", _pod("a"))
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "y"}}})
    emulator.compact()
    w = watch.Watch()
    with pytest.raises(ApiException) as gone:
        for _ in w.stream(
            core.list_namespaced_pod, "default", resource_version=created.metadata.resource_version
        ):
            pass
    assert gone.value.status == 410


def test_watch_stream_with_timeout_and_selectors(api_client: Any) -> None:
    resource = client.ResourceV1Api(api_client)
    resource.create_resource_slice(_slice("s1", "n1"))
    resource.create_resource_slice(_slice("s2", "n2"))
    w = watch.Watch()
    events = list(
        w.stream(resource.list_resource_slice, field_selector="spec.nodeName=n2", timeout_seconds=1)
    )
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "s2")]


def test_shared_informer_tracks_changes(api_client: Any, emulator: Emulator) -> None:
    from kubernetes.informer import SharedInformer

    resource = client.ResourceV1Api(api_client)
    resource.create_resource_slice(_slice("s1", "n1"))
    informer = SharedInformer(resource.list_resource_slice)
    deleted: list[str] = []
    informer.add_event_handler("DELETED", lambda obj: deleted.append(obj.metadata.name))
    informer.start()
    try:
        emulator.wait_until(lambda: len(informer.cache.list()) == 1)
        emulator.wait_for_watches(1, kind="resourceslices")
        resource.create_resource_slice(_slice("s2", "n2"))
        emulator.wait_until(lambda: len(informer.cache.list()) == 2)
        resource.delete_resource_slice("s1")
        emulator.wait_until(lambda: deleted == ["s1"])
        emulator.drop_watches("resourceslices", clean=True)
        resource.create_resource_slice(_slice("s3", "n3"))
        emulator.wait_until(
            lambda: sorted(o.metadata.name for o in informer.cache.list()) == ["s2", "s3"]
        )
    finally:
        informer.stop()


def test_aio_client(emulator: Emulator) -> None:
    from kubernetes.aio import client as aio_client
    from kubernetes.aio import watch as aio_watch

    async def run() -> list[tuple[str, str]]:
        configuration = aio_client.Configuration(host=emulator.url)
        async with aio_client.ApiClient(configuration) as api:
            core = aio_client.CoreV1Api(api)
            await core.create_namespaced_pod(
                "default",
                aio_client.V1Pod(
                    metadata=aio_client.V1ObjectMeta(name="p"),
                    spec=aio_client.V1PodSpec(
                        containers=[aio_client.V1Container(name="c", image="pause")]
                    ),
                ),
            )
            pods = await core.list_namespaced_pod("default")
            assert [p.metadata.name for p in pods.items] == ["p"]
            resource = aio_client.ResourceV1Api(api)
            await resource.create_resource_slice(_slice("s1", "n1"))
            w = aio_watch.Watch()
            seen = [
                (event["type"], event["object"].metadata.name)
                async for event in w.stream(resource.list_resource_slice, timeout_seconds=1)
            ]
            with pytest.raises(aio_client.ApiException) as missing:
                await core.read_namespaced_pod("nope", "default")
            assert missing.value.status == 404
            return seen

    assert asyncio.run(run()) == [("ADDED", "s1")]


def test_events_v1_watch_sees_core_events_converted(api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    events = client.EventsV1Api(api_client)
    core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e1"),
            message="hello",
            reason="Test",
            type="Normal",
            # the client sends datetime.isoformat(): whole seconds would lose the six digits
            # MicroTime needs (the real server answers 400), so the time has microseconds
            event_time="2026-11-23T00:00:00.123456Z",
            involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default"),
        ),
    )
    seen = [
        (e["type"], e["object"].note, e["object"].regarding.name)
        for e in watch.Watch().stream(events.list_namespaced_event, "default", timeout_seconds=1)
    ]
    assert seen == [("ADDED", "hello", "p")]
    # a core Event without eventTime shows "eventTime": null in events.k8s.io/v1, which the
    # client's EventsV1Event model refuses (as against a real server)
    raw = events.list_namespaced_event("default", _preload_content=False)
    assert json.loads(raw.data)["items"][0]["eventTime"] == "2026-11-23T00:00:00.123456Z"
