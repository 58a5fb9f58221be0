"""Compiling an expression: cel-cpp's checker (hoisted where nested past its parser's limit,
``driver.cel.deep``), upstream's compile-time rules, the static estimates, and the programs: as
compiled, instrumented to count their cost (``driver.cel.instrument``), or driven from Python
(``driver.cel.loops``)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf.message import DecodeError

from driver.api.errors import CELCompileError
from driver.cel import (
    checked,
    cost,
    deep,
    drive,
    estimate,
    instrument,
    strings,
    syntax,
)
from driver.cel.dispatch import OVERLOADS, runtime_name
from driver.cel.environment import cel_env
from driver.cel.loops import Driven, DrivenLoop
from driver.cel.messages import engine_message
from driver.cel.rewrites import fix_optional_types, rewrite_library_equality, rewrite_optionals

MAX_EXPRESSION_LENGTH: Final = 10 * 1024  # bytes, upstream CELSelectorExpressionMaxLength
COST_LIMIT: Final = cost.COST_LIMIT  # upstream CELSelectorExpressionMaxCost


@lru_cache(maxsize=64)
def driven_form(expression: str, metered: bool) -> Driven:
    """The driven form of a compiled expression (metered: of its instrumented form)."""
    compiled = compile_expression(expression)
    source = (
        instrument.instrument(compiled.checked, _self_charging)
        if metered
        else copy.deepcopy(compiled.checked)
    )
    rewrite_library_equality(source)
    rewrite_optionals(source)
    plan = drive.drive(source)

    def program(checked_expr: Any) -> Any:
        renamed = copy.deepcopy(checked_expr)
        checked.rename_calls(renamed, runtime_name)
        return _load(renamed, strict=metered)

    loops = tuple(
        DrivenLoop(
            program(loop.chunk),
            program(loop.result) if loop.result is not None else None,
            loop,
        )
        for loop in plan.loops
    )
    return Driven(program(plan.main), loops)


@dataclass(frozen=True, slots=True)
class Compiled:
    """An expression checked against upstream's compile-time rules, with its estimates."""

    checked: Any  # the checked AST, library calls under their declared names
    program: Any  # the runnable program (library calls renamed)
    output: str  # the result type (checked.type_name)
    cost: estimate.Span  # upstream's static estimate
    work: estimate.Span  # the engine's own worst case (driver.cel.estimate)

    @property
    def needs_meter(self) -> bool:
        return max(self.cost[1], self.work[1]) > COST_LIMIT


def compile_expression(expression: str) -> Compiled:
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            f"CEL expression is too long: {size} bytes, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    source = syntax.two_variable_exists_one(expression)
    program, checked_expr = _check(expression, source)
    fix_optional_types(checked_expr)
    problem = checked.validate(checked_expr, _regex_problem)
    if problem is not None:
        raise CELCompileError(f"compilation failed: {problem}")
    upstream = estimate.estimate(checked_expr)
    work = estimate.estimate(checked_expr, work=True)
    runnable = _runnable(checked_expr, rewritten=program is None)
    if runnable is not None:
        program = runnable
    output = checked.type_name(checked_expr, checked_expr.expr)
    return Compiled(checked_expr, program, output, upstream, work)


def _check(expression: str, source: str) -> tuple[Any, Any]:
    """cel-cpp's program of *source* (None where it cannot run as compiled) and its checked
    AST; an expression nested deeper than cel-cpp parses is checked hoisted
    (driver.cel.deep) and its checked AST given back as written."""
    env = cel_env()
    try:
        program = env.compile(source)
    except RuntimeError as exc:
        message = engine_message(str(exc))
        if _TOO_DEEP.search(message):
            return None, _check_deep(source)
        if source != expression:  # the message quotes the source cel-cpp read
            message = message.replace("existsOne (", "exists_one(")
        raise CELCompileError(f"compilation failed: {message}") from exc
    except RecursionError as exc:
        raise CELCompileError("compilation failed: expression nested too deeply") from exc
    return program, checked.parse_checked_expr(program.serialize())


# cel-cpp's two parse errors for nesting past its limit of 32.
_TOO_DEEP: Final = re.compile(r"recursion (limit|depth) (exceeded|of \d+ when parsing)")
DEEP_PIECES: Final = (24, 20, 16, 12, 8)  # the piece heights to try, largest first


def _check_deep(source: str) -> Any:
    """The checked AST of an expression nested past cel-cpp's limit but within upstream's
    (250): checked with its deep parts hoisted into binds, then inlined back."""
    try:
        parsed = syntax.parse(source)
    except syntax.CELSyntaxError as exc:
        raise CELCompileError(f"compilation failed: {exc}") from exc
    problem = parsed.upstream_problem
    if problem is not None:
        raise CELCompileError(f"compilation failed: {problem}")
    env = cel_env()
    for piece in DEEP_PIECES:
        hoisted = deep.hoist_source(source, parsed, piece)
        try:
            program = env.compile(hoisted.text)
        except RuntimeError as exc:
            message = engine_message(str(exc))
            if _TOO_DEEP.search(message):
                continue
            raise CELCompileError(f"compilation failed: {deep.drop_locations(message)}") from exc
        try:
            checked_expr = checked.parse_checked_expr(
                checked.flatten_deep_types(program.serialize())
            )
        except DecodeError as exc:  # cannot happen: the types were flattened
            raise CELCompileError(f"compilation failed: {_TOO_DEEP_TO_LOAD}") from exc
        deep.inline(checked_expr, hoisted.prefix)
        return checked_expr
    raise CELCompileError(
        "compilation failed: expression nested too deeply for cel-cpp even with its deep parts"
        " hoisted"
    )


def _runnable(checked_expr: Any, *, rewritten: bool = False, strict: bool = False) -> Any | None:
    """The program for a checked expression: named-format calls wrapped in optionals and
    library calls renamed to their implementations; None when nothing needed changing and
    the caller did not rewrite it itself (the engine's own program of it runs as is)."""
    out = copy.deepcopy(checked_expr)
    changed = rewrite_library_equality(out)
    changed = rewrite_optionals(out) or changed
    changed = checked.rename_calls(out, runtime_name) or changed
    if not changed and not rewritten:
        return None
    return _load(out, strict=strict)


def _load(checked_expr: Any, *, strict: bool = False) -> Any:
    """cel-expr-python's program of a checked AST (hoisted if too deep to load as it is;
    *strict* for an instrumented one, see driver.cel.deep.shallow)."""
    try:
        shallow = deep.shallow(checked_expr, strict=strict)
        return cel_env().deserialize(checked.serialize_checked(shallow))
    except RuntimeError as exc:
        raise CELCompileError(f"compilation failed: {_TOO_DEEP_TO_LOAD}") from exc


_TOO_DEEP_TO_LOAD: Final = "expression nested too deeply for cel-expr-python to load"


def _self_charging(overload_ids: list[str]) -> bool:
    """Whether a call's implementation (biaxial's, in Python) charges its own cost."""
    return all(i in OVERLOADS for i in overload_ids)


def instrumented_program(compiled: Compiled) -> Any:
    """The program that counts its actual cost (driver.cel.instrument)."""
    return _runnable(
        instrument.instrument(compiled.checked, _self_charging), rewritten=True, strict=True
    )


def _regex_problem(function: str, pattern: str) -> str | None:
    """Why a constant pattern is not a valid RE2 expression (cel-cpp's RE2 decides, as Go's
    regexp does upstream), or not one ``find`` can run; worded as Kubernetes reports it
    (cel-go's regex-literal validator for ``matches``, program instantiation for the regex
    library's ``find`` / ``findAll``)."""
    probe = cel_env().compile(f"''.matches({strings.quote_plain(pattern)})").eval()
    if probe.type() == cel.Type.ERROR:
        reason = strings.go_regexp_error(engine_message(str(probe.value())))
    else:
        problem = strings.check_regex(pattern)
        if problem is None:
            return None
        reason = strings.go_regexp_error(problem)
    if function == "matches":
        return f"invalid matches argument: {reason}"
    return f"program instantiation failed: {reason}"
