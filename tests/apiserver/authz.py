"""Helpers of the authorization tests on the real control plane: the chart's workloads run as
local processes under their ServiceAccounts' real tokens, and the API server's audit log says
what each identity asked and what it was answered.

* :class:`AuditLog` reads the API server's audit log (JSON lines, one ``ResponseComplete``
  event per request, ``ResponseStarted`` too for a watch) from a mark onwards;
  :meth:`AuditLog.settle` waits until every request made before it has been logged.
* :func:`refused` lists the requests of one user the server refused as unauthenticated or
  forbidden (401, 403) or that an admission policy denied (422 with the policy's message).
* :func:`workload` reads a rendered Deployment's or DaemonSet's container: the arguments and
  environment the chart runs the binary with.
* :func:`chart_rbac` applies the chart's roles as rendered with other values for a block (the
  session installs the defaults).
* :func:`access_review` asks the real authorizer (a ``SubjectAccessReview``) whether a user may
  do something, without doing it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import ControlPlane, ControlPlaneError, object_path
from tests.render_chart import render_objects

JSON = dict[str, Any]
#: answers that mean "not allowed": unauthenticated, forbidden
REFUSALS = frozenset({401, 403})
POLICY_DENIED = "ValidatingAdmissionPolicy"


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the audit log has it."""

    user: str
    verb: str
    uri: str
    code: int
    user_agent: str
    resource: str
    subresource: str
    namespace: str
    name: str
    message: str

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> Request:
        ref = event.get("objectRef") or {}
        status = event.get("responseStatus") or {}
        return cls(
            user=str(event["user"]["username"]),
            verb=str(event["verb"]),
            uri=str(event["requestURI"]),
            code=int(status.get("code", 0)),
            user_agent=str(event.get("userAgent", "")),
            resource=str(ref.get("resource", "")),
            subresource=str(ref.get("subresource", "")),
            namespace=str(ref.get("namespace", "")),
            name=str(ref.get("name", "")),
            message=str(status.get("message", "")),
        )

    @property
    def writes(self) -> bool:
        return self.verb in {"create", "update", "patch", "delete", "deletecollection"}

    def __str__(self) -> str:
        return f"{self.code} {self.verb} {self.uri}"


class AuditLog:
    """The audit log of ``plane`` from the moment this object is made."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.path: Path = plane.audit_log
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def requests(self) -> list[Request]:
        """Every completed request since the mark (a watch counts once, when it ends)."""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            lines = log.read().splitlines()
        out = []
        for line in lines:
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                out.append(Request.of(event))
        return out

    def settle(self, timeout: float = 10.0) -> list[Request]:
        """Wait until a request made now is logged (the log backend writes in arrival order of
        completion, so everything completed before is there too), then :meth:`requests`."""
        marker = f"/api/v1/namespaces/default/configmaps/audit-mark-{secrets.token_hex(4)}"
        self.plane.request("GET", marker)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.requests()
            if any(r.uri == marker for r in found):
                return [r for r in found if r.uri != marker]
            time.sleep(0.05)
        raise ControlPlaneError(f"the audit log did not show {marker} within {timeout} s")


def by_user(requests: Iterable[Request], user: str) -> list[Request]:
    return [r for r in requests if r.user == user]


def refused(requests: Iterable[Request], user: str) -> list[str]:
    """``user``'s requests the server refused (401, 403) or a policy denied."""
    return [
        f"{r} {r.message}"
        for r in by_user(requests, user)
        if r.code in REFUSALS or POLICY_DENIED in r.message
    ]


def workload(objects: Iterable[JSON], kind: str) -> tuple[list[str], dict[str, str], JSON]:
    """(args, literal environment, container) of the single container of the chart's
    ``kind`` (Deployment: the controller; DaemonSet: the kubelet plugin)."""
    (found,) = [o for o in objects if o["kind"] == kind]
    (container,) = found["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return list(container["args"]), env, container


def replace_arg(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``--flag=...`` replaced (the chart's in-pod paths made local)."""
    prefix = f"{flag}="
    assert any(a.startswith(prefix) for a in args), f"the chart passes no {flag}"
    return [f"{prefix}{value}" if a.startswith(prefix) else a for a in args]


def access_review(
    plane: ControlPlane,
    user: str,
    *,
    verb: str,
    resource: str,
    group: str = "",
    subresource: str = "",
    namespace: str = "",
    name: str = "",
) -> bool:
    """Whether the real authorizer lets ``user`` (a ServiceAccount user: its groups added)
    ``verb`` the resource: a ``SubjectAccessReview`` as the administrator."""
    namespace_of = user.split(":")[2] if user.startswith("system:serviceaccount:") else ""
    groups = ["system:authenticated"]
    if namespace_of:
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace_of}"]
    attributes = {
        "verb": verb,
        "group": group,
        "resource": resource,
        "subresource": subresource,
        "namespace": namespace,
        "name": name,
    }
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": groups,
            "resourceAttributes": {k: v for k, v in attributes.items() if v},
        },
    }
    status, body = plane.request(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    if status != 201:
        raise ControlPlaneError(f"SubjectAccessReview: {status} {body}")
    return bool(body["status"].get("allowed"))


RBAC_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})


@contextlib.contextmanager
def chart_rbac(plane: ControlPlane, values: Mapping[str, Any]) -> Iterator[list[JSON]]:
    """The chart's roles and bindings rendered with ``values`` applied over the installed
    (default) ones for the block, then the default ones again (server-side apply by the same
    field manager: a rule the defaults do not render is removed). Objects only ``values``
    render (a binding of an optional feature) are deleted afterwards. Yields every rendered
    object."""
    rendered = [r.obj for r in render_objects(values)]
    default = {_key(r.obj) for r in render_objects() if r.kind in RBAC_KINDS}
    extra = [o for o in rendered if o["kind"] in RBAC_KINDS]
    plane.apply(extra)
    try:
        yield rendered
    finally:
        plane.apply([r.obj for r in render_objects() if r.kind in RBAC_KINDS])
        for obj in extra:
            if _key(obj) not in default:
                plane.request("DELETE", object_path(obj))


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (str(obj["kind"]), str(meta.get("namespace", "")), str(meta["name"]))


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes in /proc/net/tcp{,6})."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
