"""Contract: label selectors (full grammar), per-kind field selectors, pagination
(must-have item 8)."""

from __future__ import annotations

import pytest

from tests.contract.conftest import Api, pod, resource_slice


def _names(listing: dict) -> list[str]:
    return sorted(i["metadata"]["name"] for i in listing["items"])


@pytest.fixture
def labelled(api: Api) -> Api:
    for name, labels in {
        "a": {"tier": "gpu", "size": "4"},
        "b": {"tier": "cpu", "size": "8"},
        "c": {"tier": "gpu"},
        "d": {},
    }.items():
        body = pod(name)
        body["metadata"]["labels"] = labels
        api.ok(api.post(api.pods(), body), 201)
    return api


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gpu", ["a", "c"]),
        ("tier==gpu", ["a", "c"]),
        ("tier!=gpu", ["b", "d"]),
        ("tier in (gpu,cpu)", ["a", "b", "c"]),
        ("tier notin (gpu)", ["b", "d"]),
        ("size", ["a", "b"]),
        ("!size", ["c", "d"]),
        ("tier=gpu,size", ["a"]),
        ("size>5", ["b"]),
    ],
)
def test_label_selector_grammar(labelled: Api, selector: str, expected: list[str]) -> None:
    assert _names(labelled.ok(labelled.get(labelled.pods(), labelSelector=selector))) == expected


def test_bad_label_selector_is_400(api: Api) -> None:
    assert api.get(api.pods(), labelSelector="tier in (gpu").status == 400


def test_resource_slice_field_selectors(api: Api) -> None:
    node_a, node_b = api.name("na"), api.name("nb")
    api.ok(api.post(api.slices(), resource_slice(api.name("s1"), node_a)), 201)
    api.ok(api.post(api.slices(), resource_slice(api.name("s2"), node_b)), 201)
    api.ok(
        api.post(
            api.slices(),
            resource_slice(api.name("s3"), node_b, driver="other.contract.example.com"),
        ),
        201,
    )
    on_b = api.ok(api.get(api.slices(), fieldSelector=f"spec.nodeName={node_b}"))
    assert _names(on_b) == [api.name("s2"), api.name("s3")]
    by_driver = api.ok(
        api.get(
            api.slices(),
            fieldSelector=f"spec.nodeName={node_b},spec.driver=other.contract.example.com",
        )
    )
    assert _names(by_driver) == [api.name("s3")]
    not_a = api.ok(
        api.get(
            api.slices(), fieldSelector=f"spec.nodeName!={node_a},metadata.name={api.name('s2')}"
        )
    )
    assert _names(not_a) == [api.name("s2")]
    by_pool = api.get(api.slices(), fieldSelector=f"spec.pool.name={node_a}")
    if api.minor >= 37:  # spec.pool.name since 1.37 (kubernetes/kubernetes#138456)
        assert _names(api.ok(by_pool)) == [api.name("s1")]
    else:
        assert by_pool.status == 400
    refused = api.get(api.slices(), fieldSelector="spec.pool.generation=1")
    assert refused.status == 400
    assert refused.reason == "BadRequest"


def test_pod_and_claim_field_selectors(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    api.ok(api.post(api.pods(), pod("q")), 201)
    api.ok(
        api.post(
            api.pods("p") + "/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p"},
                "target": {"kind": "Node", "name": "node-x"},
            },
        ),
        201,
    )
    assert _names(api.ok(api.get(api.pods(), fieldSelector="spec.nodeName=node-x"))) == ["p"]
    assert _names(api.ok(api.get(api.pods(), fieldSelector="spec.nodeName="))) == ["q"]
    assert _names(api.ok(api.get(api.pods(), fieldSelector="status.phase=Pending"))) == ["p", "q"]
    assert _names(
        api.ok(api.get(api.pods(), fieldSelector="spec.schedulerName=default-scheduler"))
    ) == ["p", "q"]
    assert _names(api.ok(api.get(api.pods(), fieldSelector="metadata.name=q"))) == ["q"]
    claims = api.get(api.claims(), fieldSelector=f"metadata.namespace={api.namespace}")
    assert claims.status == 200
    assert api.get(api.claims(), fieldSelector="spec.devices=x").status == 400
    assert api.get(api.pods(), fieldSelector="spec.containers=x").status == 400


def test_pagination_with_limit_and_continue(api: Api) -> None:
    for i in range(7):
        api.ok(api.post(api.pods(), pod(f"p{i}")), 201)
    seen: list[str] = []
    token = None
    pages = 0
    first_rv = None
    while True:
        query = {"limit": "3"}
        if token:
            query["continue"] = token
        page = api.ok(api.get(api.pods(), **query))
        pages += 1
        assert len(page["items"]) <= 3
        first_rv = first_rv or page["metadata"]["resourceVersion"]
        assert page["metadata"]["resourceVersion"] == first_rv
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
        if pages == 1:
            # optional in the API (a cache-served list may omit it); exact when present
            assert page["metadata"].get("remainingItemCount", 4) == 4
            # a change after the first page does not leak into the snapshot
            api.ok(api.post(api.pods(), pod("p99")), 201)
        if not token:
            break
    assert pages == 3
    assert seen == [f"p{i}" for i in range(7)]


def test_bad_continue_token_is_400(api: Api) -> None:
    assert api.get(api.pods(), limit="1", **{"continue": "not-a-token"}).status == 400
