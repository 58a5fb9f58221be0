"""Test hooks on the HTTP path: the request log and fault injection.

* :class:`RequestRecord` is one served request (method, path, query, content type, status,
  the client's User-Agent).
* :class:`Faults` holds one-shot or counted rules: answer the next matching request(s) with an
  error Status (a 409 Conflict on the next write, a 500/503 ...), add latency, force a 410 on
  the next watch that asks for a resourceVersion. Rules match on verb (``get list watch create
  update patch delete``; ``"write"`` means create/update/patch/delete) and resource (plural,
  optionally with ``/subresource``). Thread-safe.
* A :class:`Hold` keeps the next matching request waiting at the server, before it is served,
  until the test releases it: a request sent by a client that is gone (killed) by the time it
  is applied, as a real API server can apply it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Final

from tests.emulator.errors import ApiStatusError

WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One served request, as the emulator saw it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    verb: str
    resource: str
    status: int
    user_agent: str = ""


@dataclass(slots=True)
class FaultRule:
    verbs: frozenset[str] | None
    resource: str | None
    remaining: int
    status: int = 0
    reason: str = ""
    message: str = ""
    latency: float = 0.0

    def matches(self, verb: str, resource: str) -> bool:
        if self.verbs is not None and verb not in self.verbs:
            return False
        return self.resource is None or self.resource in {resource, resource.split("/", 1)[0]}


@dataclass(slots=True)
class Hold:
    """One held request (see the module docstring): :attr:`arrived` is set when it reaches
    the server, :meth:`release` lets it be served, :attr:`served` is set once it was
    (whatever the answer). Released anyway after ``timeout`` seconds."""

    verbs: frozenset[str] | None
    resource: str | None
    timeout: float
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    served: threading.Event = field(default_factory=threading.Event)

    def matches(self, verb: str, resource: str) -> bool:
        return FaultRule(self.verbs, self.resource, 1).matches(verb, resource)

    def release(self) -> None:
        self.released.set()

    def wait(self) -> None:
        """Called by the server: hold the request until released."""
        self.arrived.set()
        self.released.wait(self.timeout)


@dataclass(slots=True)
class Faults:
    """The active fault rules. Use the :class:`~tests.emulator.Emulator` methods to add them."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _errors: list[FaultRule] = field(default_factory=list)
    _latency: list[FaultRule] = field(default_factory=list)
    _gone: list[FaultRule] = field(default_factory=list)
    _holds: list[Hold] = field(default_factory=list)

    @staticmethod
    def _verbs(verbs: str | frozenset[str] | set[str] | None) -> frozenset[str] | None:
        if verbs is None:
            return None
        if isinstance(verbs, str):
            return WRITE_VERBS if verbs == "write" else frozenset({verbs})
        return frozenset().union(*(WRITE_VERBS if v == "write" else {v} for v in verbs))

    def add_error(
        self,
        status: int,
        *,
        verbs: str | frozenset[str] | set[str] | None,
        resource: str | None,
        count: int,
        reason: str | None,
        message: str | None,
    ) -> None:
        rule = FaultRule(
            self._verbs(verbs),
            resource,
            count,
            status,
            reason or _REASONS.get(status, "InternalError"),
            message or f"injected fault: {status}",
        )
        with self._lock:
            self._errors.append(rule)

    def add_latency(
        self, seconds: float, *, verbs: str | set[str] | None, resource: str | None, count: int
    ) -> None:
        with self._lock:
            self._latency.append(FaultRule(self._verbs(verbs), resource, count, latency=seconds))

    def add_gone(self, *, resource: str | None, count: int) -> None:
        with self._lock:
            self._gone.append(FaultRule(frozenset({"watch"}), resource, count))

    def pending(self) -> list[FaultRule]:
        """Copies of the rules not used up yet (error, latency and 410 rules)."""
        with self._lock:
            return [
                FaultRule(
                    r.verbs, r.resource, r.remaining, r.status, r.reason, r.message, r.latency
                )
                for r in (*self._errors, *self._latency, *self._gone)
            ]

    def add_hold(
        self, *, verbs: str | frozenset[str] | set[str] | None, resource: str | None, timeout: float
    ) -> Hold:
        hold = Hold(self._verbs(verbs), resource, timeout)
        with self._lock:
            self._holds.append(hold)
        return hold

    def hold_for(self, verb: str, resource: str) -> Hold | None:
        """The hold for this request, taken (each holds one request), if any."""
        with self._lock:
            for hold in self._holds:
                if hold.matches(verb, resource):
                    self._holds.remove(hold)
                    return hold
        return None

    def clear(self) -> None:
        with self._lock:
            self._errors.clear()
            self._latency.clear()
            self._gone.clear()
            for hold in self._holds:
                hold.release()
            self._holds.clear()

    @staticmethod
    def _take(rules: list[FaultRule], verb: str, resource: str) -> FaultRule | None:
        for rule in rules:
            if rule.matches(verb, resource):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    rules.remove(rule)
                return rule
        return None

    def latency_for(self, verb: str, resource: str) -> float:
        with self._lock:
            rule = self._take(self._latency, verb, resource)
            return rule.latency if rule else 0.0

    def error_for(self, verb: str, resource: str) -> ApiStatusError | None:
        with self._lock:
            rule = self._take(self._errors, verb, resource)
        if rule is None:
            return None
        return ApiStatusError(rule.status, rule.reason, rule.message)

    def gone_for(self, resource: str) -> bool:
        with self._lock:
            return self._take(self._gone, "watch", resource) is not None
