"""Cases of cel-go's two-variable comprehensions (``ext.TwoVarComprehensions``, which DRA's
environment enables): ``ext/comprehensions_test.go`` at v0.27.0 -- TestTwoVarComprehensions
(every expression, expected true), TestTwoVarComprehensionsCost (the expressions over
literals, with their pinned estimate and actual cost; those over a declared variable ``m``
need an environment DRA does not have), TestTwoVarComprehensionsStaticErrors and
TestTwoVarComprehensionsRuntimeErrors.

Where DRA's environment differs from cel-go's test environment the case says so: the strings
extension is at version 2 there (no ``reverse``), literals must be homogeneous (``[0, 0u]``
is a compile error), and a selector must be a bool (an expression whose value is a map is
compared with ``{}``, which leaves its runtime error first). cel-cpp words the checker's
macro errors in its own way ("all() second variable must be different from the first
variable" where cel-go says "duplicate variable name: i"); those cases assert the compile error
with cel-cpp's words. cel-python has no two-variable macros at all (``NO_TWO_VARIABLE``).
"""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import (
    CEL_GO_EXT,
    NO_OPTIONAL,
    NO_TWO_VARIABLE,
    Case,
    Deviation,
    celpy_error,
    celpy_syntax,
    scoped,
)

TEST = f"{CEL_GO_EXT}/comprehensions_test.go"
NOT_VERSION_2 = "found no matching overload for 'reverse' applied to '(string)'"
CELPY = celpy_error(NO_TWO_VARIABLE)
INT_DOT = "celpy's lexer reads `1.` as a float literal, so `1.all(j, k, j < k)` is a syntax error"


def _celpy(expression: str) -> Deviation:
    if "[?" in expression or "{?" in expression:
        return celpy_syntax(NO_OPTIONAL)
    if expression[0].isdigit():
        return celpy_syntax(INT_DOT)
    return CELPY


def _in(cites: str) -> tuple[Any, Any, Any]:
    return scoped(cites, collapse=True, celpy=_celpy)


ok, runtime, compile_error = _in(f"{TEST} TestTwoVarComprehensions")
TRUE = (
    # list.all()
    ok("[1, 2, 3, 4].all(i, v, i < 5 && v > 0)"),
    ok("[1, 2, 3, 4].all(i, v, i < v)"),
    ok("[1, 2, 3, 4].all(i, v, i > v) == false"),
    ok(
        "cel.bind(listA, [1, 2, 3, 4], cel.bind(listB, [1, 2, 3, 4, 5],"
        " listA.all(i, v, listB[?i].hasValue() && listB[i] == v)))"
    ),
    ok(
        "cel.bind(listA, [1, 2, 3, 4, 5, 6], cel.bind(listB, [1, 2, 3, 4, 5],"
        " listA.all(i, v, listB[?i].hasValue() && listB[i] == v))) == false"
    ),
    # list.exists(), existsOne(), exists_one()
    ok(
        "cel.bind(l, ['hello', 'world', 'hello!', 'worlds'], l.exists(i, v,"
        " v.startsWith('hello') && l[?(i+1)].optMap(next, next.endsWith('world')).orValue(false)))"
    ),
    ok(
        "cel.bind(l, ['hello', 'world', 'hello!', 'worlds'], l.existsOne(i, v,"
        " v.startsWith('hello') && l[?(i+1)].optMap(next, next.endsWith('world')).orValue(false)))"
    ),
    ok(
        "cel.bind(l, ['hello', 'goodbye', 'hello!', 'goodbye'], l.exists_one(i, v,"
        " v.startsWith('hello') && l[?(i+1)].optMap(next, next == \"goodbye\").orValue(false)))"
        " == false"
    ),
    # list.transformList()
    ok(
        "['Hello', 'world'].transformList(i, v, \"[%d]%s\".format([i, v.lowerAscii()]))"
        ' == ["[0]hello", "[1]world"]'
    ),
    ok(
        "['hello', 'world'].transformList(i, v, v.startsWith('greeting'),"
        ' "[%d]%s".format([i, v])) == []'
    ),
    ok(
        "[1, 2, 3].transformList(indexVar, valueVar, (indexVar * valueVar) + valueVar) == [1, 4, 9]"
    ),
    ok(
        "[1, 2, 3].transformList(indexVar, valueVar, indexVar % 2 == 0,"
        " (indexVar * valueVar) + valueVar) == [1, 9]"
    ),
    # list.transformMap()
    ok("['Hello', 'world'].transformMap(i, v, [v.lowerAscii()]) == {0: ['hello'], 1: ['world']}"),
    ok(
        "['world', 'Hello'].transformMap(i, v, [v.lowerAscii()])\n"
        "  .transformList(k, v, v) // extract the list back form the map\n"
        "  .flatten()\n"
        "  .sort() == ['hello', 'world']"
    ),
    ok(
        "[1, 2, 3].transformMap(indexVar, valueVar, (indexVar * valueVar) + valueVar)"
        " == {0: 1, 1: 4, 2: 9}"
    ),
    ok(
        "[1, 2, 3].transformMap(indexVar, valueVar, indexVar % 2 == 0,"
        " (indexVar * valueVar) + valueVar) == {0: 1, 2: 9}"
    ),
    # list.transformMapEntry()
    ok(
        '"key1:value1 key2:value2 key3:value3".split(" ").transformMapEntry(i, v,'
        ' cel.bind(entry, v.split(":"), entry.size() == 2 ? {entry[0]: entry[1]} : {}))'
        " == {'key1': 'value1', 'key2': 'value2', 'key3': 'value3'}"
    ),
    ok(
        '"key1:value1:extra key2:value2 key3".split(" ").transformMapEntry(i, v,'
        ' cel.bind(entry, v.split(":"), {?entry[0]: entry[?1]}))'
        " == {'key1': 'value1', 'key2': 'value2'}"
    ),
    # map.all(), exists(), existsOne(), exists_one()
    ok("{'hello': 'world', 'hello!': 'world'}.all(k, v, k.startsWith('hello') && v == 'world')"),
    ok(
        "{'hello': 'world', 'hello!': 'worlds'}.all(k, v, k.startsWith('hello')"
        " && v.endsWith('world')) == false"
    ),
    ok(
        "{'hello': 'world', 'hello!': 'worlds'}.exists(k, v, k.startsWith('hello')"
        " && v.endsWith('world'))"
    ),
    ok(
        "{'hello': 'world', 'hello!': 'worlds'}.existsOne(k, v, k.startsWith('hello')"
        " && v.endsWith('world'))"
    ),
    ok(
        "{'hello': 'world', 'hello!': 'worlds'}.exists_one(k, v, k.startsWith('hello')"
        " && v.endsWith('world'))"
    ),
    ok(
        "{'hello': 'world', 'hello!': 'wow, world'}.exists_one(k, v, k.startsWith('hello')"
        " && v.endsWith('world')) == false"
    ),
    # map.transformList()
    ok(
        "{'Hello': 'world'}.transformList(k, v, \"%s=%s\".format([k.lowerAscii(), v]))"
        ' == ["hello=world"]'
    ),
    ok(
        "dyn({'Hello': 'world'}).transformList(k, v, \"%s=%s\".format([k.lowerAscii(), v]))"
        ' == ["hello=world"]'
    ),
    ok(
        "{'hello': 'world'}.transformList(k, v, k.startsWith('greeting'),"
        ' "%s=%s".format([k, v])) == []'
    ),
    ok(
        "{'greeting': 'hello', 'farewell': 'goodbye'}.transformList(k, _, k).sort()"
        " == ['farewell', 'greeting']"
    ),
    ok(
        "{'greeting': 'hello', 'farewell': 'goodbye'}.transformList(_, v, v).sort()"
        " == ['goodbye', 'hello']"
    ),
    # map.transformMap()
    ok(
        "{'hello': 'world', 'goodbye': 'cruel world'}.transformMap(k, v,"
        ' "%s, %s!".format([k, v]))'
        " == {'hello': 'hello, world!', 'goodbye': 'goodbye, cruel world!'}"
    ),
    ok(
        "dyn({'hello': 'world', 'goodbye': 'cruel world'}).transformMap(k, v,"
        ' "%s, %s!".format([k, v]))'
        " == {'hello': 'hello, world!', 'goodbye': 'goodbye, cruel world!'}"
    ),
    ok(
        "{'hello': 'world', 'goodbye': 'cruel world'}.transformMap(k, v, v.startsWith('world'),"
        " \"%s, %s!\".format([k, v])) == {'hello': 'hello, world!'}"
    ),
    # map.transformMapEntry(): the first two use reverse(), strings version 3
    compile_error(
        "{'hello': 'world', 'greetings': 'tacocat'}.transformMapEntry(k, v,"
        " {k.reverse(): v.reverse()}) == {'olleh': 'dlrow', 'sgniteerg': 'tacocat'}",
        NOT_VERSION_2,
    ),
    compile_error(
        "{'hello': 'world', 'greetings': 'tacocat'}.transformMapEntry(k, v, v.reverse() == v,"
        " {k.reverse(): v.reverse()}) == {'sgniteerg': 'tacocat'}",
        NOT_VERSION_2,
    ),
    ok("{'hello': 'world', 'greetings': 'tacocat'}.transformMapEntry(k, v, {}) == {}"),
)

ok, runtime, compile_error = _in(f"{TEST} TestTwoVarComprehensionsCost")
# (expression, upstream's estimate (min, max), its actual cost)
COSTS = (
    ("[1, 2, 3, 4].all(i, v, i < 5 && v > 0)", (23, 39), 39),
    ("{1: 1, 2: 2, 3: 3}.all(i, v, i < 5 && v > 0)", (40, 52), 52),
    ("!{0: 0}.all(i, v, i < 5 && v > 0)", (35, 39), 39),
    ("[].transformList(i, v, v) == []", (31, 31), 31),
    ("[1].transformList(i, v, i) == [0]", (45, 45), 45),
    ("[3, 2, 1].transformList(i, v, v > i, v) == [3, 2]", (44, 80), 67),
    ("[].transformMap(k, v, v + 1) == {}", (71, 71), 71),
    ("{}.transformMap(k, v, v + 1) == {}", (91, 91), 91),
    ("{1: 2}.transformMap(k, v, v + 1) == {1: 3}", (97, 97), 97),
    (
        (
            'cel.bind(m, {"hello": "hello"}, m.transformMap(k, v, v + "world"))'
            ' == {"hello": "helloworld"}'
        ),
        (108, 108),
        108,
    ),
    ("{1: 2, 3: 4, 5: 6}.transformMap(k, v, k % 3 == 0, v + 1) == {3: 5}", (104, 116), 106),
    ("{1: 2}.transformMapEntry(k, v, {v: k}) == {2: 1}", (126, 126), 126),
)
COSTED = tuple(ok(expression, cost=cost, actual=actual) for expression, cost, actual in COSTS)

ok, runtime, compile_error = _in(f"{TEST} TestTwoVarComprehensionsStaticErrors")
# cel-go's words, then cel-cpp's (the macro expander's and the checker's).
STATIC = tuple(
    compile_error(expression, fragment)
    for expression, fragment in (
        # "duplicate variable name: i"
        ("[].all(i, i, i < i)", "second variable must be different from the first variable"),
        # "iteration variable overwrites accumulator variable"
        ("[].all(__result__, i, __result__ < i)", "first variable name cannot be __result__"),
        ("[].all(j, __result__, __result__ < j)", "second variable name cannot be __result__"),
        # "argument must be a simple name"
        ("[].all(i.j, k, i.j < k)", "first variable name must be a simple identifier"),
        ("[].all(j, i.k, j < i.k)", "second variable name must be a simple identifier"),
        ("[].exists(i.j, k, i.j < k)", "first variable name must be a simple identifier"),
        ("[].exists(j, i.k, j < i.k)", "second variable name must be a simple identifier"),
        ("[].exists_one(i.j, k, i.j < k)", "first variable name must be a simple identifier"),
        ("[].existsOne(j, i.k, j < i.k)", "second variable name must be a simple identifier"),
        ("[].transformList(i.j, k, i.j + k) == []", "first variable name must be a simple"),
        ("[].transformList(j, i.k, j + i.k) == []", "second variable name must be a simple"),
        ("{}.transformMap(i.j, k, i.j + k) == {}", "first variable name must be a simple"),
        ("{}.transformMap(j, i.k, j + i.k) == {}", "second variable name must be a simple"),
        ("{}.transformMapEntry(j, i.k, {j: i.k}) == {}", "second variable name must be a simple"),
        ("{}.transformMapEntry(i.j, k, {k: i.j}) == {}", "first variable name must be a simple"),
        # "cannot be range"
        ("1.all(j, k, j < k)", "cannot be the range of a comprehension"),
        ("''.exists(j, k, j < k)", "cannot be the range of a comprehension"),
        ("''.existsOne(j, k, j < k)", "cannot be the range of a comprehension"),
        # "no matching overload"
        ("{}.transformMapEntry(j, k, 'bad filter', {k: j}) == {}", "found no matching overload"),
        ("[1, 2].transformList(i, v, v % 2 == 0 ? [v] : v) == []", "found no matching overload"),
        (
            "{'hello': 'world', 'greetings': 'tacocat'}.transformMapEntry(k, v, []) == {}",
            "found no matching overload",
        ),
    )
)

ok, runtime, compile_error = _in(f"{TEST} TestTwoVarComprehensionsRuntimeErrors")
RUNTIME = (
    runtime("[1, 1].transformMapEntry(i, v, {v: i}) == {}", "insert failed: key 1 already exists"),
    # upstream: "insert failed: key 0 already exists"; [0, 0u] mixes int and uint
    compile_error(
        "[0, 0u].transformMapEntry(i, v, {v: i}) == {}", "expected type 'int' but found 'uint'"
    ),
)

CASES: tuple[Case, ...] = TRUE + COSTED + STATIC + RUNTIME
