"""Comprehensions driven from Python, at run time: where cel-cpp's budget of 10,000 iterations
per evaluation stops an evaluation, its comprehensions run in chunks (the plan is
``driver.cel.drive``'s; the programs are built by ``driver.cel.compiler.driven_form``). The
accumulator crosses from one chunk to the next through Python."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel

from driver.cel import (
    drive,
    library,
)
from driver.cel.messages import engine_message
from driver.cel.values import value_type_name

# --------------------------------------------------------------------------- driven loops


@dataclass(frozen=True, slots=True)
class DrivenLoop:
    chunk: Any  # program
    result: Any | None  # program
    spec: drive.Loop


@dataclass(frozen=True, slots=True)
class Driven:
    """An expression whose comprehensions run from Python in chunks (driver.cel.drive)."""

    main: Any
    loops: tuple[DrivenLoop, ...]


class _AccumulatorError:
    """An accumulator that is an error value, carried from one chunk to the next."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


@dataclass(slots=True)
class _DriveState:
    """The driven evaluation running in this thread: its programs and the device's variables,
    and a stack of the chunks running (the accumulator each starts from, and the last value
    of its loop condition)."""

    driven: Driven
    variables: Mapping[str, Any]
    accumulators: list[Any] = field(default_factory=list)
    conditions: list[bool | None] = field(default_factory=list)


_DRIVE = threading.local()


def _drive_state() -> _DriveState:
    state: _DriveState | None = getattr(_DRIVE, "state", None)
    if state is None:
        raise library.CELFunctionError("internal error: a driven loop outside its evaluation")
    return state


def current_accumulator() -> Any:
    value = _drive_state().accumulators[-1]
    if isinstance(value, _AccumulatorError):
        raise library.CELFunctionError(value.message)
    return value


def observe_condition(condition: bool) -> bool:
    _drive_state().conditions[-1] = condition
    return condition


def _run_with_accumulator(state: _DriveState, program: Any, data: dict[str, Any], accu: Any) -> Any:
    """Evaluate one part of a driven loop; the accumulator it returns (or carries as an
    error)."""
    state.accumulators.append(accu)
    state.conditions.append(None)
    try:
        result = program.eval(data=data)
    finally:
        state.accumulators.pop()
    if result.type() == cel.Type.ERROR:
        return _AccumulatorError(engine_message(str(result.value())))
    return result.plain_value()


def run_loop(index: int, operands: list[Any]) -> Any:
    """``@biaxial.loop``: comprehension *index* over its range, in chunks (driver.cel.drive)."""
    state = _drive_state()
    loop = state.driven.loops[index]
    rng, accu, *free = operands
    base = {**state.variables, **dict(zip(loop.spec.free, free, strict=True))}
    if isinstance(rng, dict):
        items: list[Any] = list(rng.items())
    elif isinstance(rng, list):
        items = rng
    else:
        raise library.CELFunctionError(
            "expected iterable type: the range of a comprehension must be a list or a map,"
            f" got {value_type_name(rng)}"
        )
    for start in range(0, len(items), drive.CHUNK):
        part = items[start : start + drive.CHUNK]
        data = {
            **base,
            drive.RANGE_NAME: dict(part) if isinstance(rng, dict) else part,
            drive.OFFSET_NAME: start,
        }
        accu = _run_with_accumulator(state, loop.chunk, data, accu)
        stopped = state.conditions.pop() is False
        if stopped:
            break
    if loop.result is not None:
        accu = _run_with_accumulator(state, loop.result, base, accu)
        state.conditions.pop()
    if isinstance(accu, _AccumulatorError):
        raise library.CELFunctionError(accu.message)
    return accu


def eval_driven(driven: Driven, variables: Mapping[str, Any]) -> Any:
    """Evaluate a driven expression against the device's (padded) variables."""
    previous = getattr(_DRIVE, "state", None)
    _DRIVE.state = _DriveState(driven, variables)
    try:
        return driven.main.eval(data=dict(variables))
    finally:
        _DRIVE.state = previous
