"""``metav1.Status`` errors with the reasons and messages the real API server uses.

Every failure inside the emulator is an :class:`ApiStatusError`; the HTTP layer turns it into
a Status body with the same code. The constructors below mirror
``k8s.io/apimachinery/pkg/api/errors`` (``NewNotFound``, ``NewConflict``, ``NewInvalid`` ...),
so the client sees the same ``reason``, ``message`` and ``details`` it would see in a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.emulator.kinds import Kind


@dataclass(frozen=True, slots=True)
class Cause:
    """One ``details.causes`` entry: ``reason`` (FieldValueInvalid ...), message, field path."""

    reason: str
    message: str
    field: str

    def to_api(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass(frozen=True, slots=True)
class FieldError:
    """A field validation error, as ``field.Error`` prints it: ``path: Type: detail``."""

    path: str
    type: str  # "Invalid value", "Required value", "Duplicate value", "Forbidden", ...
    detail: str
    value: Any = None
    show_value: bool = True

    _REASONS = {  # noqa: RUF012 - a constant table; the dataclass is frozen
        "Invalid value": "FieldValueInvalid",
        "Required value": "FieldValueRequired",
        "Duplicate value": "FieldValueDuplicate",
        "Forbidden": "FieldValueForbidden",
        "Too many": "FieldValueTooMany",
        "Too long": "FieldValueTooLong",
        "Unsupported value": "FieldValueNotSupported",
    }

    def body(self) -> str:
        if (
            self.type in {"Invalid value", "Duplicate value", "Unsupported value"}
            and self.show_value
        ):
            import json

            rendered = (
                json.dumps(self.value) if not isinstance(self.value, str) else f'"{self.value}"'
            )
            return f"{self.type}: {rendered}" + (f": {self.detail}" if self.detail else "")
        return f"{self.type}" + (f": {self.detail}" if self.detail else "")

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"

    def cause(self) -> Cause:
        return Cause(self._REASONS.get(self.type, "FieldValueInvalid"), self.body(), self.path)


@dataclass(slots=True)
class ApiStatusError(Exception):
    """An error answer: HTTP ``code``, Status ``reason``, ``message`` and optional details."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            status["details"] = self.details
        return status


def _details(kind: Kind, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind.plural}
    if kind.group:
        details["group"] = kind.group
    return details


def not_found(kind: Kind, name: str) -> ApiStatusError:
    return ApiStatusError(
        404, "NotFound", f'{kind.group_resource} "{name}" not found', _details(kind, name)
    )


def namespace_not_found(name: str) -> ApiStatusError:
    return ApiStatusError(
        404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"}
    )


def already_exists(kind: Kind, name: str) -> ApiStatusError:
    return ApiStatusError(
        409, "AlreadyExists", f'{kind.group_resource} "{name}" already exists', _details(kind, name)
    )


def conflict(kind: Kind, name: str, detail: str, *, resource: str | None = None) -> ApiStatusError:
    what = resource or kind.group_resource
    return ApiStatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {what} "{name}": {detail}',
        _details(kind, name),
    )


def precondition_failed(kind: Kind, name: str, detail: str) -> ApiStatusError:
    """A failed DeleteOptions precondition: ``rest.BeforeDelete`` names the object by its Kind
    (``Operation cannot be fulfilled on Pod "p": the UID in the precondition ...``)."""
    details: dict[str, Any] = {"name": name, "kind": kind.kind}
    if kind.group:
        details["group"] = kind.group
    return ApiStatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified_kind} "{name}": {detail}',
        details,
    )


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(kind: Kind, name: str, errors: list[FieldError]) -> ApiStatusError:
    summary = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(kind, name)
    details["kind"] = kind.kind
    details["causes"] = [e.cause().to_api() for e in errors]
    return ApiStatusError(
        422, "Invalid", f'{kind.qualified_kind} "{name}" is invalid: {summary}', details
    )


def invalid_options(options_kind: str, errors: list[FieldError]) -> ApiStatusError:
    """Query parameters that fail ``ValidateListOptions`` and the like: 422 Invalid on the
    ``meta.k8s.io`` options kind (``ListOptions.meta.k8s.io "" is invalid: ...``)."""
    summary = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    return ApiStatusError(
        422,
        "Invalid",
        f'{options_kind}.meta.k8s.io "" is invalid: {summary}',
        {
            "group": "meta.k8s.io",
            "kind": options_kind,
            "causes": [e.cause().to_api() for e in errors],
        },
    )


def invalid_patch(patched: str, detail: str) -> ApiStatusError:
    """A patched object that does not decode (an unknown field under ``Strict``, a wrong type):
    the patch handler answers ``NewInvalid(GroupKind{}, "", patch: Invalid value)``, a 422,
    where the same body in a create or update is a 400."""
    error = FieldError("patch", "Invalid value", detail, patched)
    return ApiStatusError(
        422,
        "Invalid",
        f' "" is invalid: {error}',
        {"causes": [error.cause().to_api()]},
    )


def bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, "BadRequest", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiStatusError:
    return ApiStatusError(405, "MethodNotAllowed", message, {})


def expired(message: str) -> ApiStatusError:
    return ApiStatusError(410, "Expired", message)


def too_old(rv: int) -> ApiStatusError:
    return expired(f"too old resource version: {rv}")


def unsupported_media_type(content_type: str) -> ApiStatusError:
    return ApiStatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type!r}) - accepted "
        "media types "
        "include: application/json-patch+json, application/merge-patch+json, "
        "application/strategic-merge-patch+json (server-side apply is not emulated)",
    )


def forbidden(kind: Kind, name: str, message: str) -> ApiStatusError:
    return ApiStatusError(403, "Forbidden", message, _details(kind, name))


def internal(message: str) -> ApiStatusError:
    return ApiStatusError(500, "InternalError", message, {"causes": [{"message": message}]})
