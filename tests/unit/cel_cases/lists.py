"""Cases of the list libraries: Kubernetes' lists library and cel-go's lists extension at
version 3, from apiextensions-apiserver's TestValidationExpressions ("lists", "ext lists
version 3", "stdlib list functions": there on a custom resource's ``self``, here on the same
values as literals or as a DRA device's list attributes) and from cel-go's ``ext/
lists_test.go`` (TestLists, TestListsRuntimeErrors, TestListsVersion, and TestListsCosts'
expressions over literals, with their pinned estimates and actual costs).

DRA's environment refuses mixed-type list literals (homogeneous aggregate literals), which
cel-go's own lists tests use freely: there the case expects the compile error, citing the
rule; an expression over protobuf messages (``ExampleType``) is not carried.
"""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import (
    APIEXTENSIONS_TESTS,
    CEL_GO_EXT,
    NO_SORT_BY,
    NO_TYPE_CHECKER,
    Case,
    Deviation,
    celpy_error,
    device,
    scoped,
)

DRA = "dra.example.com"
D = f'device.attributes["{DRA}"]'
LIST_DEVICE = device(
    DRA,
    {
        "ints": (1, 2, 2, 3),
        "unsortedInts": (2, 1),
        "strings": ("a", "b", "b", "c"),
        "unsortedStrings": ("b", "a"),
    },
)
HOMOGENEOUS = "DRA's environment enables homogeneous aggregate literals"
NO_ZERO_DURATION = celpy_error("celpy cannot parse duration('0'), a duration without a unit")
EMPTY_MIN = celpy_error(
    "celpy reads .min() as its own reduce macro and reports an empty list in its words",
    "empty sequence",
)
MIXED = celpy_error(
    f"{NO_TYPE_CHECKER} ({HOMOGENEOUS}); celpy fails comparing an int with a double"
)
EMPTY_SUM = celpy_error(
    "celpy's sum of an empty list (its element type unknown at run time) is the int 0, which"
    " celpy does not compare with a double or a duration"
)


def _section(test: str, section: str) -> tuple[Any, Any, Any]:
    return scoped(f"{test}/{section}" if section else test)


VALIDATION = f"{APIEXTENSIONS_TESTS} TestValidationExpressions"

ok, runtime, compile_error = _section(VALIDATION, "lists")
LISTS = (
    ok("[1, 2, 3] == [1, 2, 3] && [1, 2, 3] == [1, 2, 3]"),
    ok("1 in [1, 2, 3]"),
    ok("[1, 2, 3][0] in [1, 2, 3]"),
    ok("!(0 in [1, 2, 3])"),
    ok("[1, 2, 3] + [1, 2, 3] == [1, 2, 3, 1, 2, 3]"),
    ok("[1, 2, 3] + [4, 5] == [1, 2, 3, 4, 5]"),
    compile_error(
        "[1, 'a', false].filter(x, string(x) == 'a')",
        "expected type 'int' but found 'string'",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", "must evaluate to bool"),
    ),
)

ok, runtime, compile_error = _section(VALIDATION, "ext lists version 3")
EXT_LISTS_V3 = (
    ok("lists.range(4) == [0,1,2,3]"),
    ok("lists.range(0) == []"),
    ok("[5,1,2,3].reverse() == [3,2,1,5]"),
    ok("[].reverse() == []"),
    ok("[1].reverse() == [1]"),
    ok(
        "['are', 'you', 'as', 'bored', 'as', 'I', 'am'].reverse() == "
        "['am', 'I', 'as', 'bored', 'as', 'you', 'are']"
    ),
    ok("[false, true, true].reverse().reverse() == [false, true, true]"),
    ok("[1,2,3,4].slice(0, 4) == [1,2,3,4]"),
    ok("[1,2,3,4].slice(0, 0) == []"),
    ok("[1,2,3,4].slice(1, 1) == []"),
    ok("[1,2,3,4].slice(4, 4) == []"),
    ok("[1,2,3,4].slice(1, 3) == [2, 3]"),
    ok("dyn([]).flatten() == []"),
    ok("dyn([1,2,3,4]).flatten() == [1,2,3,4]"),
    ok("[].sort() == []"),
    ok("[1].sort() == [1]"),
    ok("[4, 3, 2, 1].sort() == [1, 2, 3, 4]"),
    ok('["d", "a", "b", "c"].sort() == ["a", "b", "c", "d"]'),
    ok("[].sortBy(e, e) == []", celpy=celpy_error(NO_SORT_BY)),
    ok('["a"].sortBy(e, e) == ["a"]', celpy=celpy_error(NO_SORT_BY)),
    ok(
        "[-3, 1, -5, -2, 4].sortBy(e, -(e * e)) == [-5, 4, -3, -2, 1]",
        celpy=celpy_error(NO_SORT_BY),
    ),
    ok(
        "[-3, 1, -5, -2, 4].map(e, e * 2).sortBy(e, -(e * e)) == [-10, 8, -6, -4, 2]",
        celpy=celpy_error(NO_SORT_BY),
    ),
    ok("lists.range(3).sortBy(e, -e) == [2, 1, 0]", celpy=celpy_error(NO_SORT_BY)),
    ok(
        '["a", "c", "b", "first"].sortBy(e, e == "first" ? "" : e) == ["first", "a", "b", "c"]',
        celpy=celpy_error(NO_SORT_BY),
    ),
    ok(
        "[{'name': 'foo'}, {'name': 'bar'}, {'name': 'baz'}].sortBy(e, e.name) == "
        "[{'name': 'bar'}, {'name': 'baz'}, {'name': 'foo'}]",
        celpy=celpy_error(NO_SORT_BY),
    ),
    ok("[].distinct() == []"),
    ok("[1].distinct() == [1]"),
    ok("[-2, 5, -2, 1, 1, 5, -2, 1].distinct() == [-2, 5, 1]"),
    ok("['c', 'a', 'a', 'b', 'a', 'b', 'c', 'c'].distinct() == ['c', 'a', 'b']"),
    ok("[[1], [1], [2]].distinct() == [[1], [2]]"),
    ok(
        "[{'name': 'a'}, {'name': 'b'}, {'name': 'a'}].distinct() == [{'name': 'a'}, {'name': 'b'}]"
    ),
    ok("[[1],[2],[3,4]].flatten() == [1,2,3,4]"),
    runtime(
        "[1,2,3,4].slice(3, 0) != [1,2]",
        "cannot slice(3, 0), start index must be less than or equal to end index",
    ),
    runtime("[1,2,3,4].slice(0, 10) != [1,2]", "cannot slice(0, 10), list is length 4"),
    runtime(
        "[1,2,3,4].slice(-5, 10) != [1,2]", "cannot slice(-5, 10), negative indexes not supported"
    ),
    runtime(
        "[1,2,3,4].slice(-5, -3) != [1,2]", "cannot slice(-5, -3), negative indexes not supported"
    ),
    runtime("[[1],[2],[3,4]].flatten(-1) == [1,2,3,4]", "level must be non-negative"),
    compile_error(
        '["d", 3, 2, "c"].sort() == ["a", "b", "c", "d"]',
        "expected type 'string' but found 'int'",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})"),
    ),
)

ok, runtime, compile_error = _section(VALIDATION, "string lists")
STRING_LISTS = (
    ok(f"{D}.strings.join('-') == 'a-b-b-c'", device=LIST_DEVICE, driver=DRA),
    ok("['a', 'b', 'c'].join('-') == 'a-b-c'"),
    ok(f"{D}.strings.join() == 'abbc'", device=LIST_DEVICE, driver=DRA),
    ok("['a', 'b', 'c'].join() == 'abc'"),
)

# "stdlib list functions": the resource's ints and strings are the device's list
# attributes (dyn, as DRA's attributes are), the other lists literals.
ok, runtime, compile_error = _section(VALIDATION, "stdlib list functions")
INTS, UNSORTED_INTS, STRINGS, UNSORTED_STRINGS = (
    f"{D}.ints",
    f"{D}.unsortedInts",
    f"{D}.strings",
    f"{D}.unsortedStrings",
)
DOUBLES, UNSORTED_DOUBLES, EMPTY_DOUBLES = (
    "[1.0, 2.0, 2.0, 3.0]",
    "[2.0, 1.0]",
    "[0.0].filter(x, false)",
)
DURATIONS = "[duration('1s'), duration('1m'), duration('1m'), duration('1h')]"
UNSORTED_DURATIONS, EMPTY_DURATIONS = (
    "[duration('1m'), duration('1s')]",
    "[duration('0')].filter(x, false)",
)
DATES = (
    "[timestamp('2000-01-01T00:00:00Z'), timestamp('2000-02-01T00:00:00Z'), "
    "timestamp('2000-02-01T00:00:00Z'), timestamp('2010-01-01T00:00:00Z')]"
)
UNSORTED_DATES = "[timestamp('2000-02-01T00:00:00Z'), timestamp('2000-01-01T00:00:00Z')]"
EMPTY_DATES = "[timestamp('2000-01-01T00:00:00Z')].filter(x, false)"
EMPTY_INTS, EMPTY_STRINGS = "[0].filter(x, false)", "[''].filter(x, false)"
OBJS = (
    "[{'f1': 'a', 'f2': 'a'}, {'f1': 'a', 'f2': 'b'}, {'f1': 'a', 'f2': 'b'}, "
    "{'f1': 'a', 'f2': 'c'}]"
)
ON_DEVICE = {"device": LIST_DEVICE, "driver": DRA}
STDLIB_LISTS = (
    ok(f"{INTS}.sum() == 8", **ON_DEVICE),
    ok(f"{INTS}.min() == 1", **ON_DEVICE),
    ok(f"{INTS}.max() == 3", **ON_DEVICE),
    ok(f"{EMPTY_INTS}.sum() == 0"),
    ok(f"{INTS}.isSorted()", **ON_DEVICE),
    ok(f"{EMPTY_INTS}.isSorted()"),
    ok(f"{UNSORTED_INTS}.isSorted() == false", **ON_DEVICE),
    ok(f"{INTS}.indexOf(2) == 1", **ON_DEVICE),
    ok(f"{INTS}.lastIndexOf(2) == 2", **ON_DEVICE),
    ok(f"{INTS}.indexOf(10) == -1", **ON_DEVICE),
    ok(f"{INTS}.lastIndexOf(10) == -1", **ON_DEVICE),
    ok(f"{DOUBLES}.sum() == 8.0"),
    ok(f"{DOUBLES}.min() == 1.0"),
    ok(f"{DOUBLES}.max() == 3.0"),
    ok(
        f"{EMPTY_DOUBLES}.sum() == 0.0",
        celpy=EMPTY_SUM,
    ),
    ok(f"{DOUBLES}.isSorted()"),
    ok(f"{EMPTY_DOUBLES}.isSorted()"),
    ok(f"{UNSORTED_DOUBLES}.isSorted() == false"),
    ok(f"{DOUBLES}.indexOf(2.0) == 1"),
    ok(f"{DOUBLES}.lastIndexOf(2.0) == 2"),
    ok(f"{DOUBLES}.indexOf(10.0) == -1"),
    ok(f"{DOUBLES}.lastIndexOf(10.0) == -1"),
    ok(f"{DURATIONS}.sum() == duration('1h2m1s')"),
    ok(f"{DURATIONS}.min() == duration('1s')"),
    ok(f"{DURATIONS}.max() == duration('1h')"),
    ok(
        f"{EMPTY_DURATIONS}.sum() == duration('0')",
        celpy=EMPTY_SUM,
    ),
    ok(f"{DURATIONS}.isSorted()"),
    ok(f"{EMPTY_DURATIONS}.isSorted()", celpy=NO_ZERO_DURATION),
    ok(f"{UNSORTED_DURATIONS}.isSorted() == false"),
    ok(f"{DURATIONS}.indexOf(duration('1m')) == 1"),
    ok(f"{DURATIONS}.lastIndexOf(duration('1m')) == 2"),
    ok(f"{DURATIONS}.indexOf(duration('2m')) == -1"),
    ok(f"{DURATIONS}.lastIndexOf(duration('2m')) == -1"),
    ok(f"{STRINGS}.min() == 'a'", **ON_DEVICE),
    ok(f"{STRINGS}.max() == 'c'", **ON_DEVICE),
    ok(f"{STRINGS}.isSorted()", **ON_DEVICE),
    ok(f"{EMPTY_STRINGS}.isSorted()"),
    ok(f"{UNSORTED_STRINGS}.isSorted() == false", **ON_DEVICE),
    ok(f"{STRINGS}.indexOf('b') == 1", **ON_DEVICE),
    ok(f"{STRINGS}.lastIndexOf('b') == 2", **ON_DEVICE),
    ok(f"{STRINGS}.indexOf('x') == -1", **ON_DEVICE),
    ok(f"{STRINGS}.lastIndexOf('x') == -1", **ON_DEVICE),
    ok(f"{DATES}.min() == timestamp('2000-01-01T00:00:00.000Z')"),
    ok(f"{DATES}.max() == timestamp('2010-01-01T00:00:00.000Z')"),
    ok(f"{DATES}.isSorted()"),
    ok(f"{EMPTY_DATES}.isSorted()"),
    ok(f"{UNSORTED_DATES}.isSorted() == false"),
    ok(f"{DATES}.indexOf(timestamp('2000-02-01T00:00:00.000Z')) == 1"),
    ok(f"{DATES}.lastIndexOf(timestamp('2000-02-01T00:00:00.000Z')) == 2"),
    ok(f"{DATES}.indexOf(timestamp('2005-02-01T00:00:00.000Z')) == -1"),
    ok(f"{DATES}.lastIndexOf(timestamp('2005-02-01T00:00:00.000Z')) == -1"),
    ok("[[1], [2]].indexOf([1]) == 0"),
    ok("[{'a': 1}, {'b': 2}].lastIndexOf({'b': 2}) == 1"),
    ok(f"{OBJS}.indexOf({OBJS}[1]) == 1"),
    ok(f"{OBJS}.lastIndexOf({OBJS}[1]) == 2"),
    ok(f"([0] + {EMPTY_INTS}).min() == 0"),
    ok("dyn([]).sum() == 0"),
    ok("dyn([1, 2]).sum() == 3"),
    ok("dyn([1.0, 2.0]).sum() == 3.0"),
    ok("[].sum() == 0"),
    runtime(f"{EMPTY_INTS}.min() == 1", "min called on empty list", celpy=EMPTY_MIN),
    runtime(f"{EMPTY_INTS}.max() == 3", "max called on empty list"),
    runtime(f"{EMPTY_DOUBLES}.min() == 1.0", "min called on empty list", celpy=EMPTY_MIN),
    runtime(f"{EMPTY_DOUBLES}.max() == 3.0", "max called on empty list"),
    runtime(f"{EMPTY_STRINGS}.min() == 'a'", "min called on empty list", celpy=EMPTY_MIN),
    runtime(f"{EMPTY_STRINGS}.max() == 'c'", "max called on empty list"),
    compile_error(
        "['a', 'b'].sum() == 'c'",
        "found no matching overload for 'sum'",
        celpy=Deviation(f"{NO_TYPE_CHECKER}; celpy's sum concatenates strings", result=False),
    ),
    compile_error("[[1], [2]].min() == [1]", "found no matching overload for 'min'"),
    compile_error("[{'a': 1}, {'b': 2}].max() == {'b': 2}", "found no matching overload for 'max'"),
)

CEL_GO = f"{CEL_GO_EXT}/lists_test.go"
ok, runtime, compile_error = _section(CEL_GO, "TestLists")
CEL_GO_LISTS = (
    compile_error(
        "[1,[2,[3,4]]].flatten() == [1,2,[3,4]]",
        "expected type 'int' but found 'list(int)'",
        celpy=Deviation(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", result=True),
    ),
    compile_error(
        "[1,2,[],[],[3,4]].flatten() == [1,2,3,4]",
        "expected type 'int' but found 'list(",
        celpy=Deviation(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", result=True),
    ),
    compile_error(
        "[1,[2,[3,4]]].flatten(2) == [1,2,3,4]",
        "expected type 'int' but found 'list(int)'",
        celpy=Deviation(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", result=True),
    ),
    compile_error(
        "[1,[2,[3,[4]]]].flatten(-1) == [1,2,3,4]",
        "expected type 'int' but found 'list(int)'",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", "level must be non-negative"),
    ),
    # the same lists with dyn elements, which DRA's environment accepts
    ok("[dyn(1), dyn([dyn(2), dyn([3, 4])])].flatten() == [dyn(1), dyn(2), dyn([3, 4])]"),
    ok("[dyn(1), dyn(2), dyn([]), dyn([]), dyn([3, 4])].flatten() == [1, 2, 3, 4]"),
    ok("[dyn(1), dyn([dyn(2), dyn([3, 4])])].flatten(2) == [1, 2, 3, 4]"),
    compile_error(
        '["d", 3, 2, "c"].sort() == ["a", "b", "c", "d"]',
        "expected type 'string' but found 'int'",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})"),
    ),
    runtime(
        '[dyn("d"), dyn(3), dyn(2), dyn("c")].sort() == ["a", "b", "c", "d"]',
        "list elements must have the same type",
        celpy=celpy_error("celpy compares the mixed elements and fails in its own words"),
    ),
    compile_error(
        '[1, 2.0, "c", 3, "c", 1].distinct() == [1, 2.0, "c", 3]',
        "expected type 'int' but found 'double'",
        celpy=MIXED,
    ),
    compile_error(
        "[1, 1.0, 2].distinct() == [1, 2]",
        "expected type 'int' but found 'double'",
        celpy=MIXED,
    ),
    ok(
        "[dyn(1), dyn(1.0), dyn(2)].distinct() == [1, 2]",
        celpy=celpy_error("celpy fails comparing an int with a double (CEL: 1 == 1.0)"),
    ),
)

ok, runtime, compile_error = _section(CEL_GO, "TestListsRuntimeErrors")
CEL_GO_ERRORS = (
    runtime("dyn({}).flatten() == []", "no such overload"),
    runtime("dyn({}).flatten(0) == []", "no such overload"),
    runtime("[].flatten(-1) == []", "level must be non-negative"),
    runtime("[].flatten(dyn('1')) == []", "no such overload"),
)

ok, runtime, compile_error = _section(CEL_GO, "TestListsVersion")
CEL_GO_VERSIONS = (
    ok("[1, 2, 3, 4, 5].slice(2, 4) == [3, 4]"),
    ok("[[1, 2], [3, 4]].flatten() == [1, 2, 3, 4]"),
    ok("[1, 2, 2, 1].distinct() == [1, 2]"),
    ok("lists.range(5) == [0, 1, 2, 3, 4]"),
    ok("[1, 2, 3].reverse() == [3, 2, 1]"),
    ok("[2, 1, 3].sort() == [1, 2, 3]"),
    ok(
        "[{'field': 'lo'}, {'field': 'hi'}].sortBy(m, m.field) == "
        "[{'field': 'hi'}, {'field': 'lo'}]",
        celpy=celpy_error(NO_SORT_BY),
    ),
)

ok, runtime, compile_error = _section(CEL_GO, "TestListsCosts")
CEL_GO_COSTS = (
    ok("lists.range(4) == [0, 1, 2, 3]", cost=(26, 26), actual=26),
    ok("lists.range(4 / 2) == [0, 1]", cost=(2**64 - 1, 2**64 - 1), actual=25),
    compile_error(
        "[[1, 2], 3].flatten(1) == [1, 2, 3]",
        "expected type 'list(int)' but found 'int'",
        celpy=Deviation(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", result=True),
    ),
    compile_error(
        "[[1], 2, 3].flatten() == [1, 2, 3]",
        "expected type 'list(int)' but found 'int'",
        celpy=Deviation(f"{NO_TYPE_CHECKER} ({HOMOGENEOUS})", result=True),
    ),
    ok("[1, 2, 3].distinct() == [1, 2, 3]", cost=(50, 50), actual=50),
    ok("[1, 1, 1].distinct() == [1]", cost=(50, 50), actual=50),
    ok("[1, 2, 3].slice(1, 3) == [2, 3]", cost=(34, 34), actual=34),
    ok("[3, 2, 1].reverse() == [1, 2, 3]", cost=(35, 35), actual=35),
    ok("[2, 3, 1].sort() == [1, 2, 3]", cost=(50, 50), actual=50),
    ok(
        "[{'x':4}, {'x':3}].sortBy(m, m['x']) == [{'x':3}, {'x':4}]",
        cost=(211, 211),
        actual=211,
        celpy=celpy_error(NO_SORT_BY),
    ),
)

CASES: tuple[Case, ...] = (
    LISTS
    + EXT_LISTS_V3
    + STRING_LISTS
    + STDLIB_LISTS
    + CEL_GO_LISTS
    + CEL_GO_ERRORS
    + CEL_GO_VERSIONS
    + CEL_GO_COSTS
)
