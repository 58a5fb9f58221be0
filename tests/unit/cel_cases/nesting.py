"""Cases of expression nesting: cel-go's parser limits (``parser/parser.go``: the recursion
listener's per-rule depth and the visitor's depth, both 250 by default, which Kubernetes keeps)
and the expressions of ``parser/parser_test.go`` TestParse that test them (there at the test
parser's limit of 32, here at 250). cel-cpp stops at 32 and cel-expr-python cannot raise it;
driver.cel.deep hoists deep parts into lazy binds so that these compile and run as upstream's.

``PARSER_LIMIT_32`` states, for the parser alone, cel-go's verdict at its test limit of 32 on
expressions shaped like TestParse's (which error, or none): driver.cel.syntax measures depth
as cel-go does.

cel-python parses with lark, whose recursion reaches Python's limit on the deepest of these;
it sets no limit of its own on a left-leaning chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.unit.cel_cases.base import Case, Deviation, celpy_error, device
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

PARSER = "google/cel-go@v0.27.0 parser/parser.go (MaxRecursionDepth 250)"
PARSER_TEST = "google/cel-go@v0.27.0 parser/parser_test.go TestParse"
RULE_LIMIT = "expression recursion limit exceeded: 250"
VISITOR_LIMIT = "max recursion depth exceeded"
A = 'device.attributes["dra.example.com"]'
DEVICE = device("dra.example.com", {"a": 5, "l": (1, 2, 3)})
CELPY_DEEP = celpy_error(
    "celpy's parser recurses past Python's limit this deep (reported when it runs)",
    "nested too deeply",
)
CELPY_NO_LIMIT = Deviation(
    "celpy sets no nesting limit of its own: a left-leaning chain of 251 terms evaluates",
    result=True,
)


def _nest(depth: int, inner: str) -> str:
    return "(" * depth + inner + ")" * depth


def _lists(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def _sum(terms: int) -> str:
    return " + ".join(["1"] * terms) + f" == {terms}"


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    kw.setdefault("device", DEVICE)
    kw.setdefault("driver", "dra.example.com")
    return _ok(f"nesting: {name}", expression, result, cites=PARSER, **kw)


def too_deep(name: str, expression: str, fragment: str, **kw: Any) -> Case:
    return _compile_error(f"nesting: {name}", expression, fragment, cites=PARSER, **kw)


CASES: tuple[Case, ...] = (
    ok("33 parentheses", _nest(33, "true")),
    ok("100 parentheses", _nest(100, "true"), celpy=CELPY_DEEP),
    ok("249 parentheses (the limit)", _nest(249, "true"), celpy=CELPY_DEEP),
    too_deep("250 parentheses", _nest(250, "true"), RULE_LIMIT, celpy=CELPY_DEEP),
    ok("33 nested lists", _lists(33) + " != []"),
    ok("248 nested lists", _lists(248) + " != []", celpy=CELPY_DEEP),
    ok("249 nested lists (the limit)", _lists(249) + " != []", celpy=CELPY_DEEP),
    too_deep("250 nested lists", _lists(250) + " != []", RULE_LIMIT, celpy=CELPY_DEEP),
    ok(
        "100 indexes into 100 nested lists",
        _lists(100) + "[0]" * 100 + " == 1",
        celpy=CELPY_DEEP,
    ),
    ok("34 additions", _sum(34)),
    ok("250 terms (the visitor's limit)", _sum(250)),
    too_deep("251 terms", _sum(251), VISITOR_LIMIT, celpy=CELPY_NO_LIMIT),
    ok("40 calls around a device attribute", "int(" * 40 + f"{A}.a" + ")" * 40 + " == 5"),
    ok(
        "a deep predicate reading the macro's variable", f"{A}.l.all(x, " + _nest(60, "x > 0") + ")"
    ),
    ok(
        "40 nested macros reading the outermost's variable",
        "".join(f"[{i}].all(x{i}, " for i in range(40)) + "x0 + x39 == 39" + ")" * 40,
    ),
    ok("a deep error short-circuited by &&", "false && " + _nest(60, "1 / 0 == 1"), False),
    ok("a deep error short-circuited by ?:", "true ? true : " + _nest(60, "1 / 0 == 1")),
    _runtime(
        "nesting: a deep error evaluated",
        _nest(60, "1 / 0 == 1"),
        "divide by zero",
        cites=PARSER,
    ),
    _compile_error(
        "nesting: a deep type error",
        _nest(60, "1 + 'a'") + " == 1",
        "found no matching overload for '_+_' applied to '(int, string)'",
        cites=PARSER,
        celpy=celpy_error("celpy has no type checker: the type error surfaces at run time"),
    ),
)


@dataclass(frozen=True, slots=True)
class DepthCase:
    """cel-go's verdict on *expression* at its test parser's limit of 32: which error (the
    listener's, the visitor's) or none."""

    name: str
    expression: str
    error: str | None


PARSER_LIMIT_32: tuple[DepthCase, ...] = (
    DepthCase("more than 32 nested list creations", _lists(33), "expression recursion"),
    DepthCase("32 nested list creations", _lists(31), None),
    DepthCase("more than 32 arithmetic operations", " + ".join(map(str, range(1, 35))), "max"),
    DepthCase("32 arithmetic operations", " + ".join(map(str, range(1, 33))), None),
    DepthCase(
        "more than 32 field selections", "a." + ".".join("bcdefghijklmnopqrstuvwxyzABCDEFGH"), "max"
    ),
    DepthCase(
        "more than 32 index operations", "a" + "".join(f"[{i}]" for i in range(1, 34)), "max"
    ),
    DepthCase(
        "more than 32 relation operators", "a" + "".join(f" < {i}" for i in range(1, 34)), "max"
    ),
    DepthCase(
        "more than 32 index / relation operators",
        " !=\n".join(["a" + "".join(f"[{i}]" for i in range(1, 21))] * 14),
        "max",
    ),
    DepthCase("33 nested parentheses", _nest(32, "x"), "expression recursion"),
    DepthCase("31 nested parentheses", _nest(31, "x"), None),
)
