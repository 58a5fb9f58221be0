"""The admission step as a mutating webhook (controller.webhook), driven by the same table as
the pure function and the chart's policy (tests/admission_cases.py): each case's pod in an
AdmissionReview v1, the patch the webhook answers applied as the API server applies it
(RFC 6902, the ``jsonpatch`` library), gives what the table says. And bad input: every
malformed review gets an answer that says what was wrong, never a traceback.

The response rules are upstream's (Kubernetes docs, "Dynamic Admission Control", *Webhook
request and response*): ``apiVersion``/``kind`` as sent (``admission.k8s.io/v1``
``AdmissionReview``), ``response.uid`` copied from ``request.uid``, ``response.allowed``,
and a mutation as ``patchType: JSONPatch`` with the base64-encoded patch.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from controller import webhook
from controller.settings import DEFAULT_ADMISSION_SCHEDULERS
from driver.scheduling.admission import admit
from tests.admission_cases import CASES, SCHEDULERS, VALUES, Case, expected, observed

JSON = dict[str, Any]
SCOPE = webhook.scope(frozenset(SCHEDULERS), "biaxial")


def review_of(pod: Any, *, uid: str = "7d1c3b5e", **request: Any) -> JSON:
    body = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": pod,
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def answer(body: bytes | JSON) -> tuple[int, JSON]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = webhook.review(raw, SCOPE)
    assert got.content_type == "application/json"
    return got.status, json.loads(got.body)


def admitted(pod: JSON) -> JSON:
    status, out = answer(review_of(pod))
    assert status == 200
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = out["response"]
    assert response["uid"] == "7d1c3b5e"
    assert response["allowed"] is True
    if "patch" not in response:
        assert "patchType" not in response
        return pod
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    return dict(jsonpatch.apply_patch(pod, patch))


def test_the_chart_default_schedulers_are_the_controllers() -> None:
    assert DEFAULT_ADMISSION_SCHEDULERS == SCHEDULERS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_table_through_the_webhook(case: Case) -> None:
    """The API server sends only opted-in namespaces' pods (namespaceSelector), so every case
    is in scope here; the pure function, applied, gives the very same pod."""
    before = copy.deepcopy(case.pod)
    after = admitted(case.pod)
    assert case.pod == before
    assert observed(after) == expected(case, in_scope=True)
    change = admit(case.pod, {}, SCOPE)
    assert after == (change.apply(case.pod) if change else case.pod)


def test_the_patch_adds_to_existing_resources_and_annotations() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"cpu": "1"}}},
            ]
        },
    }
    after = admitted(pod)
    assert after["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", "nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    assert after["metadata"]["annotations"]["gpu-fraction"] == "0.5"


def test_a_second_call_changes_nothing() -> None:
    """reinvocationPolicy IfNeeded may call the webhook again on the pod it mutated: the
    step is idempotent (nothing left to change, no patch)."""
    for case in CASES:
        once = admitted(case.pod)
        assert admitted(once) == once, case.name


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "the body is not JSON"),
        (b"\xff\xfe", "the body is not JSON"),
        (b"[1, 2]", "the body is a JSON list, not an AdmissionReview"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
            (
                "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got apiVersion "
                "'admission.k8s.io/v1beta1'"
            ),
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            "the review has no request object",
        ),
        (json.dumps(review_of({}, uid="")), "request.uid is missing or not a string"),
        (json.dumps(review_of({}, uid=7)), "request.uid is missing or not a string"),  # type: ignore[arg-type]
        (b"{" * 100_000, "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b" " * (webhook.MAX_BODY + 1), "bytes, more than"),
    ],
)
def test_a_malformed_review_is_refused_with_the_reason(body: bytes | str, says: str) -> None:
    raw = body.encode() if isinstance(body, str) else body
    status, out = answer(raw)
    assert status == 400
    response = out["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert says in response["status"]["message"]
    assert response["status"]["message"].startswith("biaxial admission webhook: ")


@pytest.mark.parametrize(
    ("pod", "says"),
    [
        ("a string", "request.object is not an object"),
        (None, "request.object is not an object"),
        ({"metadata": [], "spec": {}}, "request.object.metadata is not an object"),
        ({"metadata": {"annotations": {"a": 1}}}, "annotations is not a map of strings"),
        ({"spec": {"containers": {"main": {}}}}, "request.object.spec.containers is not a list"),
        ({"spec": {"initContainers": ["x"]}}, "request.object.spec.initContainers[0] is not"),
        (
            {"spec": {"containers": [{"name": "m", "resources": {"limits": ["nvidia.com/gpu"]}}]}},
            "containers[0].resources.limits is not a map",
        ),
        ({"spec": {"schedulerName": 3, "containers": []}}, "spec.schedulerName is not a string"),
    ],
)
def test_a_pod_admission_cannot_read_is_allowed_unchanged_with_a_warning(
    pod: Any, says: str
) -> None:
    status, out = answer(review_of(pod))
    assert status == 200
    response = out["response"]
    assert response == {
        "uid": "7d1c3b5e",
        "allowed": True,
        "warnings": [response["warnings"][0]],
    }
    assert says in response["warnings"][0]


@pytest.mark.parametrize(
    "request_fields",
    [
        {"operation": "UPDATE"},
        {"kind": {"group": "", "version": "v1", "kind": "Service"}},
        {"kind": "Pod"},
        {"subResource": "ephemeralcontainers"},
    ],
)
def test_anything_but_a_pod_being_created_is_allowed_as_is(request_fields: JSON) -> None:
    gpu_pod = next(c for c in CASES if c.name == "hami").pod
    status, out = answer(review_of(gpu_pod, **request_fields))
    assert (status, out["response"]) == (200, {"uid": "7d1c3b5e", "allowed": True})


def test_an_internal_error_is_an_answer_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(webhook, "admit", broken)
    status, out = answer(review_of(next(c for c in CASES if c.name == "hami").pod))
    assert status == 500
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["message"] == (
        "biaxial admission webhook: internal error: boom"
    )


def test_simulate_scopes_both_mechanisms_alike_and_names_a_bad_one() -> None:
    """``biaxial simulate --admission-values`` agrees with either mechanism of the chart."""
    from biaxial.simulate.admission import from_values
    from driver.api.errors import ManifestError

    webhook_values = copy.deepcopy(VALUES)
    webhook_values["admission"]["mechanism"] = "webhook"
    assert from_values(webhook_values) == from_values(VALUES)
    bad = copy.deepcopy(VALUES)
    bad["admission"]["mechanism"] = "sidecar"
    with pytest.raises(ManifestError, match=r"admission\.mechanism 'sidecar' is not one of policy"):
        from_values(bad)
