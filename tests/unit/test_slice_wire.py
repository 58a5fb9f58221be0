"""ResourceSlice list items read typed (``ResourceSlice.from_wire`` of what
``kubeapi.codec.loads_list`` decodes as ``WireSlice``) against the same items read as JSON
data (``ResourceSlice.from_api``): the same model, or the same error, for the common form and
for every departure from it, malformed ones included; and the slice informer's relist stores
the same models and leaves out the same objects whichever way its pages are read."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest

from controller.api import RESOURCE_SLICES, ListResult
from controller.cache import Informer, TypedList, parse_or_skip
from driver.api.errors import BiaxialError
from driver.api.model import ResourceSlice, WireSlice
from kubeapi import codec
from tests.unit.controller_fakes import FakeApi

JSON = dict[str, Any]


def _device(index: int) -> JSON:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "productName": {"string": "Tesla T4"},
            "index": {"int": index},
            "driverVersion": {"version": "550.54.15"},
            "mig": {"bool": False},
            "uuid": {"string": f"GPU-{index:04d}"},
        },
        "capacity": {
            "memory": {
                "value": "15Gi",
                "requestPolicy": {
                    "default": "15Gi",
                    "validRange": {"min": "1Mi", "max": "15Gi", "step": "1Mi"},
                },
            },
            "cores": {"value": "100", "requestPolicy": {"validValues": ["50", "100"]}},
            "slots": {"value": "4"},
        },
        "allowMultipleAllocations": True,
    }


def _slice() -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": "node-a-gpu",
            "uid": "u-1",
            "resourceVersion": "7",
            "generation": 2,
            "ownerReferences": [{"kind": "Node", "name": "node-a", "uid": "n-1"}],
        },
        "spec": {
            "driver": "gpu.biaxial.dev",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [_device(0), _device(1)],
        },
    }


def _set(path: str, value: Any) -> Callable[[JSON], None]:
    """A change setting the member at ``path`` (dot-separated; list positions as numbers)."""

    def change(obj: JSON) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return change


def _drop(path: str) -> Callable[[JSON], None]:
    def change(obj: JSON) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        del target[last]

    return change


DEVICE = "spec.devices.0"
ATTRIBUTE = f"{DEVICE}.attributes.productName"
MEMORY = f"{DEVICE}.capacity.memory"

#: Departures from the common form: the typed reading must agree with the JSON reading on each.
CHANGES: dict[str, Callable[[JSON], None]] = {
    "as published": lambda obj: None,
    "no devices": _drop("spec.devices"),
    "devices null": _set("spec.devices", None),
    "no nodeName": _drop("spec.nodeName"),
    "nodeName empty": _set("spec.nodeName", ""),
    "nodeName null": _set("spec.nodeName", None),
    "nodeName a number": _set("spec.nodeName", 5),
    "allNodes": _set("spec.allNodes", True),
    "nodeSelector": _set("spec.nodeSelector", {"nodeSelectorTerms": []}),
    "perDeviceNodeSelection": _set("spec.perDeviceNodeSelection", True),
    "shared counters": _set(
        "spec.sharedCounters", [{"name": "c", "counters": {"memory": {"value": "1Gi"}}}]
    ),
    "an unknown spec field": _set("spec.future", 1),
    "no driver": _drop("spec.driver"),
    "driver a number": _set("spec.driver", 3),
    "no pool": _drop("spec.pool"),
    "pool null": _set("spec.pool", None),
    "pool name a number": _set("spec.pool.name", 4),
    "pool generation a string": _set("spec.pool.generation", "3"),
    "pool generation null": _set("spec.pool.generation", None),
    "pool generation a float": _set("spec.pool.generation", 1.5),
    "pool count missing": _drop("spec.pool.resourceSliceCount"),
    "an unknown pool field": _set("spec.pool.future", "x"),
    "spec null": _set("spec", None),
    "spec a list": _set("spec", []),
    "no spec": _drop("spec"),
    "a status": _set("status", {}),
    "a status not an object": _set("status", "x"),
    "an unknown top-level field": _set("future", {}),
    "no metadata": _drop("metadata"),
    "metadata generation a word": _set("metadata.generation", "two"),
    "metadata generation a string": _set("metadata.generation", "2"),
    "metadata generateName": _set("metadata.generateName", "node-a-"),
    "no ownerReferences": _drop("metadata.ownerReferences"),
    "labels not strings": _set("metadata.labels", {"a": 1}),
    "device without a name": _drop(f"{DEVICE}.name"),
    "device name empty": _set(f"{DEVICE}.name", ""),
    "device name a number": _set(f"{DEVICE}.name", 7),
    "device not an object": _set(DEVICE, "gpu"),
    "device taints": _set(f"{DEVICE}.taints", [{"key": "k", "effect": "NoSchedule"}]),
    "device counters": _set(
        f"{DEVICE}.consumesCounters", [{"counterSet": "c", "counters": {"m": {"value": "1"}}}]
    ),
    "device nodeName": _set(f"{DEVICE}.nodeName", "node-a"),
    "an unknown device field": _set(f"{DEVICE}.future", 1),
    "attributes null": _set(f"{DEVICE}.attributes", None),
    "no attributes": _drop(f"{DEVICE}.attributes"),
    "attribute with two kinds": _set(ATTRIBUTE, {"string": "T4", "int": 1}),
    "attribute with no kind": _set(ATTRIBUTE, {}),
    "attribute null": _set(ATTRIBUTE, None),
    "attribute a string": _set(ATTRIBUTE, "T4"),
    "attribute of an unknown kind": _set(ATTRIBUTE, {"float": 1.5}),
    "string null": _set(ATTRIBUTE, {"string": None}),
    "string a number": _set(ATTRIBUTE, {"string": 1}),
    "int a float": _set(ATTRIBUTE, {"int": 1.0}),
    "int a bool": _set(ATTRIBUTE, {"int": True}),
    "int past 64 bits": _set(ATTRIBUTE, {"int": 2**70}),
    "bool a number": _set(ATTRIBUTE, {"bool": 1}),
    "version a number": _set(ATTRIBUTE, {"version": 1}),
    "strings list": _set(ATTRIBUTE, {"strings": ["a", "b"]}),
    "empty list": _set(ATTRIBUTE, {"ints": []}),
    "versions list": _set(ATTRIBUTE, {"versions": ["1.0.0"]}),
    "capacity null": _set(f"{DEVICE}.capacity", None),
    "no capacity": _drop(f"{DEVICE}.capacity"),
    "capacity value a number": _set(f"{MEMORY}.value", 15),
    "capacity value not a quantity": _set(f"{MEMORY}.value", "lots"),
    "capacity without a value": _drop(f"{MEMORY}.value"),
    "capacity a string": _set(MEMORY, "15Gi"),
    "capacity policy null": _set(f"{MEMORY}.requestPolicy", None),
    "capacity policy default null": _set(f"{MEMORY}.requestPolicy.default", None),
    "capacity range without min": _drop(f"{MEMORY}.requestPolicy.validRange.min"),
    "capacity range null": _set(f"{MEMORY}.requestPolicy.validRange", None),
    "capacity values not strings": _set(f"{MEMORY}.requestPolicy.validValues", [1]),
    "an unknown capacity field": _set(f"{MEMORY}.future", "x"),
    "an unknown policy field": _set(f"{MEMORY}.requestPolicy.future", "x"),
    "multiple allocations null": _set(f"{DEVICE}.allowMultipleAllocations", None),
    "multiple allocations a word": _set(f"{DEVICE}.allowMultipleAllocations", "yes"),
    "no multiple allocations": _drop(f"{DEVICE}.allowMultipleAllocations"),
}


def _outcome(parse: Callable[[], ResourceSlice | None]) -> object:
    try:
        return parse()
    except BiaxialError as exc:
        return f"{type(exc).__name__}: {exc}"


def _read_as_json(text: bytes) -> object:
    return _outcome(lambda: ResourceSlice.from_api(codec.loads(text)))


def _read_typed(text: bytes) -> tuple[object, bool]:
    """The outcome of the typed reading, and whether the typed form decided it."""
    (item,) = codec.loads_list(b'{"items":[' + text + b"]}", WireSlice)["items"]
    if isinstance(item, codec.Typed):
        model = ResourceSlice.from_wire(item.value)
        if model is not None:
            return model, True
        return _read_as_json(bytes(item.text)), False
    return _outcome(lambda: ResourceSlice.from_api(item)), False


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_the_typed_reading_gives_what_the_json_reading_gives(name: str) -> None:
    obj = _slice()
    CHANGES[name](obj)
    text = codec.dumps(obj)
    typed, decided = _read_typed(text)
    assert typed == _read_as_json(text)
    if name in {"as published", "no capacity", "no attributes", "no devices", "no nodeName"}:
        assert decided
        assert isinstance(typed, ResourceSlice)


@pytest.mark.parametrize(
    "text",
    [
        # Duplicate keys: the last wins, in both readings, wherever it stands.
        (
            b'{"metadata":{"name":"s"},"spec":{"driver":"d","pool":{"name":"p"},"devices":'
            b'[{"name":"g","attributes":{"a":{"int":1},"a":{"string":"x"}}}]}}'
        ),
        b'{"metadata":{"name":"s"},"spec":5,"spec":{"driver":"d","pool":{"name":"p"}}}',
        b'{"metadata":{"name":"s"},"spec":{"driver":"d","pool":{"name":"p"}},"spec":5}',
        (
            b'{"metadata":{"name":"s"},"spec":{"driver":"d","pool":{"name":"p"},"devices":'
            b'[{"name":"g","attributes":{"a":{"int":1,"int":2}}}]}}'
        ),
    ],
)
def test_duplicate_keys_are_read_alike(text: bytes) -> None:
    typed, _ = _read_typed(text)
    assert typed == _read_as_json(text)


def test_a_page_not_of_the_usual_form_is_read_as_json() -> None:
    for page in (b'{"items":null}', b'{"metadata":5,"items":[]}', b'{"items":{}}', b"[]", b"{}"):
        assert codec.loads_list(page, WireSlice) == codec.loads(page)
    page = b'{"kind":"List","metadata":{"continue":"c"},"items":[5,{"a":1}]}'
    assert codec.loads_list(page, WireSlice) == {
        "metadata": {"continue": "c"},
        "items": [5, {"a": 1}],
    }
    with pytest.raises(ValueError):
        codec.loads_list(b'{"items":[{"a":}]}', WireSlice)


def test_the_slice_informer_stores_the_same_whichever_way_it_reads_its_pages() -> None:
    """A relist of a page with good and malformed slices: the same models stored, the same
    objects left out (and counted), read typed or not."""
    objects: list[JSON] = []
    for i, name in enumerate(sorted(CHANGES)):
        obj = _slice()
        CHANGES[name](obj)
        if isinstance(obj.get("metadata"), dict):
            obj["metadata"]["name"] = f"slice-{i:03d}"
        objects.append(obj)
    objects.append({"metadata": {"name": 5}})  # an envelope every reader refuses

    def transform(raw: JSON) -> ResourceSlice | None:
        return parse_or_skip("ResourceSlice", ResourceSlice.from_api, raw)

    async def relist(typed: TypedList[ResourceSlice | None] | None) -> Informer[Any]:
        api = FakeApi()
        api.lists = [ListResult(items=copy.deepcopy(objects), resource_version="9")]
        informer: Informer[ResourceSlice | None] = Informer(
            api, RESOURCE_SLICES, transform=transform, typed=typed
        )
        await informer.relist()
        return informer

    read_typed: list[ResourceSlice] = []

    def from_wire(wire: WireSlice) -> ResourceSlice | None:
        model = ResourceSlice.from_wire(wire)
        if model is not None:
            read_typed.append(model)
        return model

    plain = asyncio.run(relist(None))
    typed = asyncio.run(relist(TypedList(WireSlice, from_wire)))
    assert read_typed  # (the common form was read typed)
    assert typed.store == plain.store
    assert typed.stats.malformed == plain.stats.malformed > 0
    assert any(v is not None for v in typed.store.values())
