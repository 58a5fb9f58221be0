"""The admission step as a mutating webhook, for clusters without MutatingAdmissionPolicy.

The chart's ``admission.mechanism: webhook`` registers a ``MutatingWebhookConfiguration``
whose service is the controller's Deployment; every replica (leader or standby) serves
``POST /mutate-pods`` over TLS (:mod:`kubeapi.serving`, off the event loop). Each request is
an ``admission.k8s.io/v1`` ``AdmissionReview``; the answer is the same review with
``response`` filled in, as the API server requires (Kubernetes docs, "Dynamic Admission
Control", *Response*: ``apiVersion``/``kind`` as sent, ``response.uid`` equal to
``request.uid``, ``allowed``, and for a mutation ``patchType: JSONPatch`` with the base64 RFC
6902 patch). The mutation is :func:`driver.scheduling.admission.admit`, the very function the
policy is held to and ``biaxial simulate --admission`` applies, turned into a patch by
:meth:`~driver.scheduling.admission.Admission.json_patch`.

The namespace scope is the API server's: the configuration's ``namespaceSelector`` (the
administrator's label selector, minus ``kube-system`` and the release's namespace) decides
which requests are sent at all, and an ``AdmissionReview`` carries no namespace labels. So
the webhook's own :class:`~driver.scheduling.admission.AdmissionScope` selects every
namespace; the scheduler names it takes over come from ``--admission-schedulers``.

Contract: :func:`review` never raises. A body that is not an ``admission.k8s.io/v1``
``AdmissionReview`` with a ``request.uid`` is HTTP 400 with a review whose response refuses
and says what was wrong (the API server then applies the configuration's ``failurePolicy``);
a well-formed review of anything but a pod being created, or of a pod admission cannot read,
is allowed unchanged (with a warning naming the problem where the pod is malformed: judging
pods is the API server's validation, not this step's). Pure apart from logging.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from driver.api.labels import LabelSelector
from driver.scheduling.admission import AdmissionScope, admit

log = logging.getLogger(f"biaxial.{__name__}")

PATH: Final = "/mutate-pods"
API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
#: the largest review read (the API server's own request limit is 3 MiB; a pod is far less)
MAX_BODY: Final = 3 * 1024 * 1024
_JSON: Final = "application/json"


class Answer(NamedTuple):
    """An HTTP answer: status, body, content type (what :mod:`kubeapi.serving` sends)."""

    status: int
    body: bytes
    content_type: str = _JSON


def scope(schedulers: frozenset[str], scheduler_name: str) -> AdmissionScope:
    """The webhook's scope: every namespace (the API server applied the namespaceSelector)."""
    return AdmissionScope(LabelSelector(), schedulers, scheduler_name)


def _answer(status: int, uid: str, response: Mapping[str, Any]) -> Answer:
    review = {"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": uid, **response}}
    return Answer(status, json.dumps(review, separators=(",", ":")).encode())


def _bad_review(reason: str) -> Answer:
    log.warning("refused a malformed admission review: %s", reason)
    return _answer(
        400,
        "",
        {
            "allowed": False,
            "status": {
                "code": 400,
                "reason": "BadRequest",
                "message": f"biaxial admission webhook: {reason}",
            },
        },
    )


def _pod_problem(pod: Any) -> str | None:
    """What makes ``pod`` unreadable to admission (None: readable). The API server decodes
    pods before admission, so this only guards against a caller that is not the API server."""
    if not isinstance(pod, Mapping):
        return "request.object is not an object"
    for key in ("metadata", "spec"):
        if pod.get(key) is not None and not isinstance(pod.get(key), Mapping):
            return f"request.object.{key} is not an object"
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations")
    if annotations is not None and not (
        isinstance(annotations, Mapping) and all(isinstance(v, str) for v in annotations.values())
    ):
        return "request.object.metadata.annotations is not a map of strings"
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"request.object.spec.{field} is not a list"
        for i, c in enumerate(containers):
            if not isinstance(c, Mapping):
                return f"request.object.spec.{field}[{i}] is not an object"
            resources = c.get("resources")
            if resources is not None and not isinstance(resources, Mapping):
                return f"request.object.spec.{field}[{i}].resources is not an object"
            for part in ("limits", "requests"):
                value = (resources or {}).get(part)
                if value is not None and not isinstance(value, Mapping):
                    return f"request.object.spec.{field}[{i}].resources.{part} is not a map"
    for key in ("schedulerName", "nodeName"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            return f"request.object.spec.{key} is not a string"
    return None


def review(body: bytes, admission_scope: AdmissionScope) -> Answer:
    """The answer to one ``POST /mutate-pods`` (see the module docstring); never raises."""
    try:
        return _review(body, admission_scope)
    except Exception as exc:
        log.exception("the admission webhook failed on a review")
        return _answer(
            500,
            "",
            {
                "allowed": False,
                "status": {
                    "code": 500,
                    "reason": "InternalError",
                    "message": f"biaxial admission webhook: internal error: {exc}",
                },
            },
        )


def _review(body: bytes, admission_scope: AdmissionScope) -> Answer:
    if len(body) > MAX_BODY:
        return _bad_review(f"the review is {len(body)} bytes, more than {MAX_BODY}")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        return _bad_review(f"the body is not JSON: {exc}")
    except RecursionError:
        return _bad_review("the body is nested too deeply to be an AdmissionReview")
    if not isinstance(doc, dict):
        return _bad_review(f"the body is a JSON {type(doc).__name__}, not an AdmissionReview")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        return _bad_review(
            f"expected apiVersion {API_VERSION} kind {KIND}, got apiVersion "
            f"{doc.get('apiVersion')!r} kind {doc.get('kind')!r} "
            "(the configuration's admissionReviewVersions must be [v1])"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        return _bad_review("the review has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _bad_review("request.uid is missing or not a string")
    kind = request.get("kind") or {}
    what = (
        (kind.get("group"), kind.get("kind"), request.get("operation"))
        if isinstance(kind, dict)
        else None
    )
    if what != ("", "Pod", "CREATE") or request.get("subResource"):
        # Not ours (the configuration's rules send pods being created only): allowed as is.
        return _answer(200, uid, {"allowed": True})
    pod = request.get("object")
    problem = _pod_problem(pod)
    if problem is not None:
        log.warning("admission left a pod it cannot read unchanged: %s", problem)
        return _answer(
            200,
            uid,
            {
                "allowed": True,
                "warnings": [f"biaxial admission left this pod unchanged: {problem}"],
            },
        )
    assert isinstance(pod, Mapping)
    decision = admit(pod, {}, admission_scope)
    if decision is None:
        return _answer(200, uid, {"allowed": True})
    patch = decision.json_patch(pod)
    log.info(
        "admission: %s/%s: %s",
        request.get("namespace", ""),
        (pod.get("metadata") or {}).get("name")
        or (pod.get("metadata") or {}).get("generateName", ""),
        decision.note(),
    )
    return _answer(
        200,
        uid,
        {
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        },
    )
