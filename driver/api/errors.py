"""biaxial's error hierarchy. Every error a user can meet is one of these, with a message that
says what is wrong and where, so the CLI, events and conditions can show it as one line::

    BiaxialError
    ├── InvalidInputError            bad input from a user; nothing was changed
    │   ├── QuantityError            a malformed Kubernetes quantity
    │   ├── ManifestError            a malformed or unsupported object / file
    │   ├── CELCompileError          a selector that does not compile (with position)
    │   ├── PolicyError              an unknown binpack/spread policy value
    │   ├── ConfigError              invalid opaque driver configuration (names the field)
    │   └── ValidationError          an object that breaks an API limit (attribute count, names)
    ├── CELEvaluationError           a selector failed at run time (missing key, non-bool, cost)
    ├── AllocationError              a fatal allocation error for a pod (unknown class, All on
    │   │                            an incomplete pool, CEL runtime error); not "does not fit"
    │   └── NodeAllocationError      allocation failed on this node only (invalid pools): the
    │                                node is unschedulable with this message, others may fit
    ├── DiscoveryError               NVML is unavailable or reported something unusable
    │   └── MigError                 creating or destroying a MIG instance failed (placement
    │                                taken, MIG mode off, NVML refused)
    ├── CheckpointError              the kubelet plugin's checkpoint is unreadable or corrupt
    ├── PrepareError                 a claim cannot be prepared on this node (per claim)
    └── ApiError                     the Kubernetes API answered with an error
        ├── NotFoundError            404
        ├── ConflictError            409 (stale resourceVersion or AlreadyExists)
        ├── GoneError                410 (watch history expired)
        ├── ServerError              5xx and transport failures; retryable
        └── (NotLeaderError)         not from the API: a write the controller's leader fence
                                     refused before sending it (controller.leader; status 0)

    DeadlineExceededError            not a BiaxialError on purpose: the caller's deadline
                                     (driver.cel.cost.limits) passed during an evaluation

HTTP status codes are mapped to ``ApiError`` subclasses in exactly one place:
:func:`api_error_for_status`. Always ``raise ... from`` the underlying exception.
"""

from __future__ import annotations

from typing import Final

#: How much of a value from user input (an annotation, a name) an error message quotes.
QUOTE_LIMIT: Final = 64


class BiaxialError(Exception):
    """Base class of every error biaxial raises on purpose."""


class InvalidInputError(BiaxialError):
    """Input from a user (manifest, flag, annotation, selector) is invalid."""


class QuantityError(InvalidInputError):
    """A string is not a valid Kubernetes quantity."""


class ManifestError(InvalidInputError):
    """A file or object is malformed or of an unsupported kind."""


class CELCompileError(InvalidInputError):
    """A CEL expression does not compile or is not allowed (length, result type)."""


class PolicyError(InvalidInputError):
    """An unknown scheduling policy value (annotation, flag or setting)."""


class ConfigError(InvalidInputError):
    """Invalid opaque device configuration or settings; the message names the field."""


class ValidationError(InvalidInputError):
    """An object breaks a limit of the resource.k8s.io/v1 API that the schema does not check."""


class CELEvaluationError(BiaxialError):
    """A CEL expression failed at run time: missing key, wrong type, non-bool, cost limit."""


class DeadlineExceededError(Exception):
    """The deadline of the enclosing :func:`driver.cel.cost.limits` block passed while a CEL
    selector was being evaluated (the controller's per-decision deadline).

    It says nothing about the expression, the device or the pod, so it is deliberately not a
    :class:`BiaxialError`: nothing that absorbs, caches or reports input errors (the CEL match
    cache, device classification, the allocator, the decision engine's ``PodError``) catches
    it, and it ends the whole decision. Whoever set the deadline reports it."""


class AllocationError(BiaxialError):
    """A fatal allocation error for a pod: retry later, do not treat as 'does not fit'."""


class NodeAllocationError(AllocationError):
    """Allocation failed on one node for a reason of that node (upstream's
    ``ErrFailedAllocationOnNode``: invalid resource pools). Not fatal for the pod: the node is
    unschedulable with this message and other nodes may still fit. A caller that does not
    tell it apart still stops safely (it is an AllocationError)."""


class DiscoveryError(BiaxialError):
    """GPU discovery failed (no NVML, no driver, an unusable answer)."""


class MigError(DiscoveryError):
    """A MIG instance could not be created or destroyed; the message names the GPU, the
    profile and placement, and NVML's reason."""


class CheckpointError(BiaxialError):
    """The checkpoint file is unreadable, corrupt or of an unknown version."""


class PrepareError(BiaxialError):
    """A claim cannot be prepared or unprepared on this node."""


class ApiError(BiaxialError):
    """The Kubernetes API answered with an error."""

    def __init__(self, message: str, *, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFoundError(ApiError):
    """404 NotFound."""


class ConflictError(ApiError):
    """409 Conflict or AlreadyExists."""


class GoneError(ApiError):
    """410 Gone / Expired: the watch must relist."""


class ServerError(ApiError):
    """5xx, 429 or a transport failure: the call may be retried."""


def api_error_for_status(status: int, message: str, reason: str = "") -> ApiError:
    """Map an HTTP status code to the matching ApiError subclass (the only such mapping)."""
    cls: type[ApiError]
    if status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 410:
        cls = GoneError
    elif status == 429 or status >= 500 or status == 0:
        cls = ServerError
    else:
        cls = ApiError
    return cls(message, status=status, reason=reason)


def clip(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters marked as cut with the full length: what a
    message may carry of user input (a 200 KB annotation must not travel into every write)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def quoted(value: str, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters of it (see :func:`clip`)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
