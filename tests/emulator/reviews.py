"""``TokenReview`` and ``SubjectAccessReview``: the two reviews a component with delegated
authentication and authorization (kube-scheduler's secure serving, biaxial's
``--metrics-auth=delegated``) asks the API server for.

The emulator does not authenticate its own clients (out of scope, README); these reviews answer
from what a test registers instead of from a token authenticator and the RBAC authorizer:

* :meth:`Reviews.add_token`: a bearer token and the user it stands for. TokenReview answers
  ``authenticated: true`` with that user, its groups plus ``system:authenticated`` (as the
  API server's authenticators add it); any other token ``authenticated: false`` with an
  ``error``, as the real server does (the request itself succeeds: 201).
* :meth:`Reviews.allow`: lets a user (or ``group:<name>``) use a verb on a non-resource path,
  matched as RBAC matches ``nonResourceURLs`` (exact, or a prefix ending in ``*``).
  SubjectAccessReview answers ``allowed`` with a reason naming the grant, otherwise
  ``allowed: false`` with an empty reason (no opinion: RBAC denies by default).

Both are create-only, cluster-scoped and not stored; the answer echoes the request with its
``status`` (and ``metadata.creationTimestamp: null``, as the real server returns it). A body
without ``spec.token``, or a SubjectAccessReview without exactly one of
``resourceAttributes`` / ``nonResourceAttributes`` or without a user or group, is a 422 with
the API server's wording. Resource attributes are answered ``allowed: false``: no test needs
RBAC on resources here (``tests/integration/test_chart_rbac.py`` models it from the chart).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

from tests.emulator.errors import ApiStatusError

TOKEN_REVIEWS: Final = ("authentication.k8s.io", "v1", "tokenreviews")
ACCESS_REVIEWS: Final = ("authorization.k8s.io", "v1", "subjectaccessreviews")


@dataclass(frozen=True, slots=True)
class User:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()


def _invalid(kind: str, group: str, message: str, field: str, reason: str) -> ApiStatusError:
    return ApiStatusError(
        422,
        "Invalid",
        f'{kind}.{group} "" is invalid: {field}: {reason}: {message}',
        {
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueRequired", "message": message, "field": field}],
        },
    )


class Reviews:
    """The tokens and non-resource grants the reviews answer from (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, User] = {}
        self._grants: set[tuple[str, str, str]] = set()

    def add_token(self, token: str, username: str, *groups: str, uid: str = "") -> None:
        with self._lock:
            self._tokens[token] = User(username, uid, groups)

    def allow(self, subject: str, verb: str, path: str) -> None:
        """``subject``: a user name, or ``group:<name>``; ``path`` may end in ``*``."""
        with self._lock:
            self._grants.add((subject, verb, path))

    def token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        token = (body.get("spec") or {}).get("token")
        if not isinstance(token, str) or not token:
            raise _invalid(
                "TokenReview", "authentication.k8s.io", "", "spec.token", "Required value"
            )
        with self._lock:
            user = self._tokens.get(token)
        if user is None:
            status: dict[str, Any] = {"user": {}, "error": "invalid bearer token"}
        else:
            info: dict[str, Any] = {
                "username": user.username,
                "groups": [*user.groups, "system:authenticated"],
            }
            if user.uid:
                info["uid"] = user.uid
            status = {"authenticated": True, "user": info}
        return _answer(body, "TokenReview", "authentication.k8s.io/v1", status)

    def access_review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec") or {}
        resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        group = "authorization.k8s.io"
        if (resource is None) == (non_resource is None):
            raise _invalid(
                "SubjectAccessReview",
                group,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                "spec.resourceAttributes",
                "Invalid value",
            )
        user, groups = spec.get("user") or "", list(spec.get("groups") or [])
        if not user and not groups:
            raise _invalid(
                "SubjectAccessReview",
                group,
                "at least one of user or group must be specified",
                "spec.user",
                "Invalid value",
            )
        status: dict[str, Any] = {"allowed": False}
        if non_resource is not None:
            verb, path = non_resource.get("verb", ""), non_resource.get("path", "")
            subjects = {user, *(f"group:{g}" for g in groups)}
            with self._lock:
                grants = list(self._grants)
            for subject, granted_verb, granted_path in grants:
                if (
                    subject in subjects
                    and granted_verb in {verb, "*"}
                    and _path_matches(granted_path, path)
                ):
                    status = {"allowed": True, "reason": f"allowed for {subject}"}
                    break
        return _answer(body, "SubjectAccessReview", f"{group}/v1", status)


def _path_matches(granted: str, path: str) -> bool:
    if granted.endswith("*"):
        return path.startswith(granted[:-1])
    return granted == path


def _answer(body: dict[str, Any], kind: str, api_version: str, status: dict[str, Any]) -> Any:
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": None},
        "spec": body.get("spec") or {},
        "status": status,
    }
