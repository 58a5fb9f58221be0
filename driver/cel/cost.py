"""Runtime bounds of one CEL evaluation: actual cost in upstream's units, and a deadline.

Upstream (cel-go with Kubernetes' cost estimator) counts an *actual cost* while it evaluates
and cancels the evaluation when it passes the limit (1,000,000 for DRA selectors): 1 per
identifier, field selection or call, 0 per constant, 10 per list literal, 30 per map literal,
and for size-dependent functions a multiple of the sizes involved (0.1 per character walked,
the product of string and pattern sizes for regular expressions, ...).

cel-expr-python counts nothing, so ``driver.cel.engine`` meters an evaluation itself when its
static estimate could pass the limit: the expression is instrumented
(``driver.cel.instrument``) to charge upstream's actual cost as it runs -- the fixed cost of
each region of the expression it enters, the engine's size-dependent functions from their
actual operands -- and the functions biaxial implements charge their own (:func:`charge`,
:func:`charge_traversal`). Each charge checks the cost limit and the deadline; once either is
passed every later charge fails too, so the evaluation unwinds quickly, and the engine reports
the cancellation whatever the expression's result (an error absorbed by ``||`` does not hide
it).

The meter also counts *work* that upstream does not have: the elements the engine copies when
it concatenates lists or inserts into a comprehension's map (cel-go shares them; cel-cpp
copies), cancelled at :data:`WORK_LIMIT` ("operation cancelled: evaluation work limit
exceeded"), so a list-doubling expression cannot exhaust memory.

Callers bound evaluations with :func:`limits`::

    with cost.limits(deadline=time.monotonic() + 10):   # seconds on the monotonic clock
        allocate(...)

which every evaluation in the block (in this thread or context) obeys; the default is the
cost limit alone. A metered evaluation checks the deadline at every charge; any other checks
it before it starts (:func:`deadline_passed`), so a block of many cheap but slow evaluations
stops at the deadline too. Passing the cost limit is a property of the expression and the
device (an error the caller may cache); passing the deadline is not (``Meter.timed_out``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

COST_LIMIT: Final = 1_000_000  # upstream CELSelectorExpressionMaxCost
WORK_LIMIT: Final = 5_000_000  # elements copied by list concatenation and map inserts
STRING_TRAVERSAL_FACTOR: Final = 0.1  # cel-go common.StringTraversalCostFactor
REGEX_LENGTH_FACTOR: Final = 0.25  # cel-go common.RegexStringLengthCostFactor
DEADLINE_MESSAGE: Final = "operation cancelled: evaluation deadline exceeded"
NO_LIMIT: Final = sys.maxsize  # a meter that counts for the deadline alone


class CostLimitExceeded(Exception):  # noqa: N818 - the name says what happened, as upstream's
    """Raised inside a metered evaluation when the cost limit or the deadline is passed."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds for every evaluation in a :func:`limits` block."""

    cost: int = COST_LIMIT
    deadline: float | None = None  # time.monotonic() value


_DEFAULT_LIMITS: Final = Limits()
_LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar(
    "cel_limits", default=_DEFAULT_LIMITS
)


@contextlib.contextmanager
def limits(*, cost: int = COST_LIMIT, deadline: float | None = None) -> Iterator[Limits]:
    """Bound the CEL evaluations in this block: actual cost per evaluation, and a deadline
    (``time.monotonic()`` value) for all of them."""
    value = Limits(cost, deadline)
    token = _LIMITS.set(value)
    try:
        yield value
    finally:
        _LIMITS.reset(token)


def current_limits() -> Limits:
    return _LIMITS.get()


def deadline_passed() -> bool:
    """Whether the deadline of the enclosing :func:`limits` block (if any) has passed."""
    deadline = _LIMITS.get().deadline
    return deadline is not None and time.monotonic() > deadline


class Meter:
    """The running cost of one evaluation. Not thread-safe: one per evaluation."""

    __slots__ = ("cost", "deadline", "exceeded", "limit", "reason", "timed_out", "work")

    def __init__(self, bounds: Limits) -> None:
        self.cost = 0
        self.work = 0
        self.limit = bounds.cost
        self.deadline = bounds.deadline
        self.exceeded = False
        self.timed_out = False  # the deadline, not the cost limit, stopped the evaluation
        self.reason = ""

    def add(self, amount: int) -> None:
        if self.exceeded:
            raise CostLimitExceeded(self.reason)
        self.cost += amount
        if self.cost > self.limit:
            self._trip("operation cancelled: actual cost limit exceeded")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.timed_out = True
            self._trip(DEADLINE_MESSAGE)

    def add_work(self, elements: int) -> None:
        if self.exceeded:
            raise CostLimitExceeded(self.reason)
        self.work += elements
        if self.work > WORK_LIMIT:
            self._trip(
                "operation cancelled: evaluation work limit exceeded (biaxial's engine copies"
                f" lists and maps where upstream shares them: over {WORK_LIMIT:,} elements)"
            )

    def _trip(self, reason: str) -> None:
        self.exceeded = True
        self.reason = reason
        raise CostLimitExceeded(reason)


_LOCAL = threading.local()


def active() -> Meter | None:
    """The meter of the evaluation running in this thread, if it is metered."""
    meter: Meter | None = getattr(_LOCAL, "meter", None)
    return meter


@contextlib.contextmanager
def metering(meter: Meter | None) -> Iterator[None]:
    """Make *meter* the active one for the evaluation run inside the block (nests)."""
    previous = getattr(_LOCAL, "meter", None)
    _LOCAL.meter = meter
    try:
        yield
    finally:
        _LOCAL.meter = previous


def charge(amount: int) -> None:
    """Charge *amount* to the active meter, if any (library functions call this)."""
    meter = getattr(_LOCAL, "meter", None)
    if meter is not None:
        meter.add(amount)


def charge_work(elements: int) -> None:
    """Count *elements* copied by the engine in the active meter, if any."""
    meter = getattr(_LOCAL, "meter", None)
    if meter is not None:
        meter.add_work(elements)


def charge_traversal(size: int) -> None:
    """Charge walking *size* characters or elements once (0.1 each, rounded up)."""
    meter = getattr(_LOCAL, "meter", None)
    if meter is not None:
        meter.add(math.ceil(size * STRING_TRAVERSAL_FACTOR))
