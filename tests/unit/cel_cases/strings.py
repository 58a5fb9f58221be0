# ruff: noqa: RUF001 -- upstream's cases spell Greek letters on purpose
"""Cases of cel-go's strings extension at the version DRA's environment enables (2), and of
Kubernetes' regex library: cel-go ``ext/strings_test.go`` (TestStrings -- its expressions that
need only a parse are type errors here, as DRA compiles with the checker; ``reverse`` is
version 3 --, TestStringsVersions, TestQuoteUnquote's costs), ``ext/formatting_test.go``
TestStringFormat (the formatter versions 1 to 3 share; the cases whose locale is en_US, which
Kubernetes leaves, or none; its pinned costs), and apiextensions' "stdlib regex functions"
scenario (its ``self.str`` as a literal).
"""

from __future__ import annotations

from typing import Any

from driver.cel.strings import quote_plain
from tests.unit.cel_cases.base import (
    APIEXTENSIONS_TESTS,
    CEL_GO_EXT,
    NO_TYPE_CHECKER,
    Case,
    Deviation,
    celpy_compile,
    celpy_error,
    celpy_syntax,
    scoped,
)
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime
from tests.unit.cel_cases.costs import CostCase

STRINGS_TEST = f"{CEL_GO_EXT}/strings_test.go"
FORMAT_TEST = f"{CEL_GO_EXT}/formatting_test.go TestStringFormat"
INT_DOT = "celpy's lexer reads `42.` as a float literal, so `42.charAt(2)` is a syntax error"
INT_DOT_IN = "celpy's lexer reads `24.indexOf` as `24.` (a float), `in`, `dexOf`"


def _int_receiver(expression: str) -> Deviation:
    if ".indexOf" in expression:
        return celpy_error(INT_DOT_IN, "undeclared reference to 'dexOf'")
    return celpy_syntax(INT_DOT)


NOT_VERSION_2 = "found no matching overload for 'reverse' applied to '(string)'"


ok, runtime, compile_error = scoped(f"{STRINGS_TEST} TestStrings")
STRINGS = (
    ok("'tacocat'.charAt(3) == 'o'"),
    ok("'tacocat'.charAt(7) == ''"),
    ok("'©αT'.charAt(0) == '©' && '©αT'.charAt(1) == 'α' && '©αT'.charAt(2) == 'T'"),
    ok("'tacocat'.indexOf('') == 0"),
    ok("'tacocat'.indexOf('ac') == 1"),
    ok("'tacocat'.indexOf('none') == -1"),
    ok("'tacocat'.indexOf('', 3) == 3"),
    ok("'tacocat'.indexOf('a', 3) == 5"),
    ok("'tacocat'.indexOf('at', 3) == 5"),
    ok("'ta©o©αT'.indexOf('©') == 2"),
    ok("'ta©o©αT'.indexOf('©', 3) == 4"),
    ok("'ta©o©αT'.indexOf('©αT', 3) == 4"),
    ok("'ta©o©αT'.indexOf('©α', 5) == -1"),
    ok("'ijk'.indexOf('k') == 2"),
    ok("'hello wello'.indexOf('hello wello') == 0"),
    ok("'hello wello'.indexOf('ello', 6) == 7"),
    ok("'hello wello'.indexOf('elbo room!!') == -1"),
    ok("'hello wello'.indexOf('elbo room!!!') == -1"),
    ok("''.lastIndexOf('@@') == -1"),
    ok("'tacocat'.lastIndexOf('') == 7"),
    ok("'tacocat'.lastIndexOf('at') == 5"),
    ok("'tacocat'.lastIndexOf('none') == -1"),
    ok("'tacocat'.lastIndexOf('', 3) == 3"),
    ok("'tacocat'.lastIndexOf('a', 3) == 1"),
    ok("'ta©o©αT'.lastIndexOf('©') == 4"),
    ok("'ta©o©αT'.lastIndexOf('©', 3) == 2"),
    ok("'ta©o©αT'.lastIndexOf('©α', 4) == 4"),
    ok("'hello wello'.lastIndexOf('ello', 6) == 1"),
    ok("'hello wello'.lastIndexOf('low') == -1"),
    ok("'hello wello'.lastIndexOf('elbo room!!') == -1"),
    ok("'hello wello'.lastIndexOf('elbo room!!!') == -1"),
    ok("'hello wello'.lastIndexOf('hello wello') == 0"),
    ok("'bananananana'.lastIndexOf('nana', 7) == 6"),
    ok("'TacoCat'.lowerAscii() == 'tacocat'"),
    ok("'TacoCÆt'.lowerAscii() == 'tacocÆt'"),
    ok("'TacoCÆt Xii'.lowerAscii() == 'tacocÆt xii'"),
    ok('"12 days 12 hours".replace("{0}", "2") == "12 days 12 hours"'),
    ok('"{0} days {0} hours".replace("{0}", "2") == "2 days 2 hours"'),
    ok('"{0} days {0} hours".replace("{0}", "2", 1).replace("{0}", "23") == "2 days 23 hours"'),
    ok('"1 ©αT taco".replace("αT", "o©α") == "1 ©o©α taco"'),
    ok('"hello hello".replace("", "_") == "_h_e_l_l_o_ _h_e_l_l_o_"'),
    ok('"hello hello".replace("h", "") == "ello ello"'),
    ok('"hello world".split(" ") == ["hello", "world"]'),
    ok('"hello world events!".split(" ", 0) == []'),
    ok('"hello world events!".split(" ", 1) == ["hello world events!"]'),
    ok('"o©o©o©o".split("©", -1) == ["o", "o", "o", "o"]'),
    ok('"tacocat".substring(4) == "cat"'),
    ok('"tacocat".substring(7) == ""'),
    ok('"tacocat".substring(0, 4) == "taco"'),
    ok('"tacocat".substring(4, 4) == ""'),
    ok("'ta©o©αT'.substring(2, 6) == \"©o©α\""),
    ok("'ta©o©αT'.substring(7, 7) == \"\""),
    ok('" \\f\\n\\r\\t\\vtext  ".trim() == "text"'),
    ok('"\\u0085\\u00a0\\u1680text".trim() == "text"'),
    ok(
        '"text\\u2000\\u2001\\u2002\\u2003\\u2004\\u2004\\u2006\\u2007\\u2008\\u2009".trim() '
        '== "text"'
    ),
    ok('"\\u200atext\\u2028\\u2029\\u202F\\u205F\\u3000".trim() == "text"'),
    ok(
        '"\\u180etext\\u200b\\u200c\\u200d\\u2060\\ufeff".trim()\n'
        '\t\t\t\t== "\\u180etext\\u200b\\u200c\\u200d\\u2060\\ufeff"'
    ),
    ok("'tacoCat'.upperAscii() == 'TACOCAT'"),
    ok("'tacoCαt'.upperAscii() == 'TACOCαT'"),
    compile_error("'gums'.reverse() == 'smug'", NOT_VERSION_2),
    compile_error("'palindromes'.reverse() == 'semordnilap'", NOT_VERSION_2),
    ok("['x', 'y'].join() == 'xy'"),
    ok("['x', 'y'].join('-') == 'x-y'"),
    ok("[].join() == ''"),
    ok("[].join('-') == ''"),
    ok('strings.quote("first\\nsecond") == "\\"first\\\\nsecond\\""'),
    ok('strings.quote("bell\\a") == "\\"bell\\\\a\\""'),
    ok('strings.quote("\\bbackspace") == "\\"\\\\bbackspace\\""'),
    ok('strings.quote("\\fform feed") == "\\"\\\\fform feed\\""'),
    ok('strings.quote("carriage \\r return") == "\\"carriage \\\\r return\\""'),
    ok('strings.quote("horizontal tab\\t") == "\\"horizontal tab\\\\t\\""'),
    ok('strings.quote("vertical \\v tab") == "\\"vertical \\\\v tab\\""'),
    ok('strings.quote("double \\\\\\\\ slash") == "\\"double \\\\\\\\\\\\\\\\ slash\\""'),
    ok(
        'strings.quote("two escape sequences \\a\\n") == "\\"two escape sequences \\\\a\\\\n\\""',
    ),
    ok('strings.quote("verbatim") == "\\"verbatim\\""'),
    ok('strings.quote("ends with \\\\") == "\\"ends with \\\\\\\\\\""'),
    ok('strings.quote("\\\\ starts with") == "\\"\\\\\\\\ starts with\\""'),
    ok('strings.quote("printable unicode😀") == "\\"printable unicode😀\\""'),
    ok('strings.quote("mid string \\" quote") == "\\"mid string \\\\\\" quote\\""'),
    ok(
        "strings.quote('single-quote with \"double quote\"') == "
        '"\\"single-quote with \\\\\\"double quote\\\\\\"\\""'
    ),
    ok('strings.quote("size(\'ÿ\')") == "\\"size(\'ÿ\')\\""'),
    ok('strings.quote("size(\'πέντε\')") == "\\"size(\'πέντε\')\\""'),
    ok('strings.quote("завтра") == "\\"завтра\\""'),
    ok(
        'strings.quote("\\U0001F431\\U0001F600\\U0001F61B") == '
        '"\\"\\U0001F431\\U0001F600\\U0001F61B\\""',
    ),
    ok('strings.quote("ta©o©αT") == "\\"ta©o©αT\\""'),
    ok('strings.quote("") == "\\"\\""'),
    ok("strings.quote('%s %s').format(['hello', 'world']) == \"\\\"hello world\\\"\""),
    runtime("'tacocat'.charAt(30) == ''", "index out of range: 30"),
    ok("'tacocat'.indexOf('a', 30) == -1"),
    runtime("'tacocat'.lastIndexOf('a', -1) == -1", "index out of range: -1"),
    ok("'tacocat'.lastIndexOf('a', 30) == -1"),
    runtime('"tacocat".substring(40) == "cat"', "index out of range: 40"),
    runtime('"tacocat".substring(-1) == "cat"', "index out of range: -1"),
    runtime('"tacocat".substring(1, 50) == "cat"', "index out of range: 50"),
    runtime('"tacocat".substring(49, 50) == "cat"', "index out of range: 49"),
    runtime('"tacocat".substring(4, 3) == ""', "invalid substring range. start: 4, end: 3"),
    # Upstream parses these only and expects "no such overload" at run time; DRA checks
    # every selector, so each is a compile error here, as Kubernetes reports it.
    *(
        compile_error(
            expression,
            "found no matching overload for",
            celpy=_int_receiver(expression) if expression[0].isdigit() else celpy_compile(),
        )
        for expression in (
            '42.charAt(2) == ""',
            "'hello'.charAt(true) == \"\"",
            "24.indexOf('2') == 0",
            "'hello'.indexOf(true) == 1",
            "42.indexOf('4', 0) == 0",
            "'42'.indexOf(4, 0) == 0",
            "'42'.indexOf('4', '0') == 0",
            '42.split("2") == ["4"]',
            '42.replace(2, 1) == "41"',
            '"42".replace(2, 1) == "41"',
            '"42".replace("2", 1) == "41"',
            '42.replace("2", "1", 1) == "41"',
            '"42".replace(2, "1", 1) == "41"',
            '"42".replace("2", 1, 1) == "41"',
            '"42".replace("2", "1", "1") == "41"',
            '42.split("") == ["4", "2"]',
            '"42".split(2) == ["4"]',
            '42.split("2", "1") == ["4"]',
            '"42".split(2, 1) == ["4"]',
            '"42".split("2", "1") == ["4"]',
            '30.substring(true, 3) == ""',
            '"tacocat".substring(true, 3) == ""',
            '"tacocat".substring(0, false) == ""',
        )
    ),
    # A call with an argument count no overload has: cel-go's checker reports "found no
    # matching overload for", cel-cpp's "undeclared reference to" the function.
    *(
        compile_error(expression, f"undeclared reference to '{function}'")
        for expression, function in (
            ("'42'.indexOf('4', 0, 1) == 0", "indexOf"),
            ('"42".replace("2", "1", 1, false) == "41"', "replace"),
            ('"42".split("2", 1, 1) == ["4"]', "split"),
            ("'hello'.substring(1, 2, 3) == \"\"", "substring"),
        )
    ),
)

ok, runtime, compile_error = scoped(f"{STRINGS_TEST} TestStringsVersions")
VERSIONS = (
    ok("''.charAt(0) == ''"),
    ok("'a'.indexOf('a') == 0"),
    ok("'a'.lastIndexOf('a') == 0"),
    ok("['a', 'b'].join() == 'ab'"),
    ok("['a', 'b'].join('-') == 'a-b'"),
    ok("'a'.lowerAscii() == 'a'"),
    ok("'hello hello'.replace('he', 'we') == 'wello wello'"),
    ok("'hello hello hello'.split(' ') == ['hello', 'hello', 'hello']"),
    ok("'tacocat'.substring(4) == 'cat'"),
    ok("'  \\ttrim\\n    '.trim() == 'trim'"),
    ok("'TacoCat'.upperAscii() == 'TACOCAT'"),
    ok("'a %d'.format([1]) == 'a 1'"),
    ok(
        'strings.quote(\'\\a \\b "double quotes"\') == \'"\\\\a \\\\b \\\\"double quotes\\\\""\'',
    ),
    compile_error("'taco'.reverse() == 'ocat'", NOT_VERSION_2),
)

ok, runtime, compile_error = scoped(
    f"{APIEXTENSIONS_TESTS} TestValidationExpressions/stdlib regex functions"
)
STR = "'this is a 123 string 456'"
REGEX = (
    ok(f"{STR}.find('[0-9]+') == '123'"),
    ok(f"{STR}.find('[0-9]+') != '456'"),
    ok(f"{STR}.find('xyz') == ''"),
    ok(f"{STR}.findAll('[0-9]+') == ['123', '456']"),
    ok(f"{STR}.findAll('[0-9]+', 0) == []"),
    ok(f"{STR}.findAll('[0-9]+', 1) == ['123']"),
    ok(f"{STR}.findAll('[0-9]+', 2) == ['123', '456']"),
    ok(f"{STR}.findAll('[0-9]+', 3) == ['123', '456']"),
    ok(f"{STR}.findAll('[0-9]+', -1) == ['123', '456']"),
    ok(f"{STR}.findAll('xyz') == []"),
    ok(f"{STR}.findAll('xyz', 1) == []"),
    compile_error(
        f"{STR}.find(')') == ''",
        "error parsing regexp",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} (the pattern is checked when it runs)"),
    ),
    compile_error(
        f"{STR}.findAll(')') == []",
        "error parsing regexp",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} (the pattern is checked when it runs)"),
    ),
    compile_error(
        f"{STR}.findAll(')', 1) == []",
        "error parsing regexp",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} (the pattern is checked when it runs)"),
    ),
    compile_error(
        f"{STR}.matches('x++')",
        "invalid matches argument",
        celpy=celpy_error(f"{NO_TYPE_CHECKER} (the pattern is checked when it runs)"),
    ),
)


def _format(name: str, fmt: str, args: str, expected: str, **kw: Any) -> Case:
    expression = f"{quote_plain(fmt)}.format([{args}]) == {quote_plain(expected)}"
    return _ok(f"TestStringFormat/{name}", expression, cites=f"{FORMAT_TEST}/{name}", **kw)


def _format_error(
    name: str, fmt: str, args: str, fragment: str, *, compile_time: bool, **kw: Any
) -> Case:
    expression = f"{quote_plain(fmt)}.format([{args}]) == ''"
    make = _compile_error if compile_time else _runtime
    if compile_time:
        kw.setdefault("celpy", celpy_compile())
    return make(
        f"TestStringFormat/{name}", expression, fragment, cites=f"{FORMAT_TEST}/{name}", **kw
    )


NO_LOCALE_PRINTER = celpy_error(
    "celpy binds the same formatter; it parses these arguments (uint(), type(), bytes"
    " escapes) in its own way"
)
FORMAT = (
    _format("no-op", "no substitution", "", "no substitution"),
    _format(
        "mid-string substitution",
        "str is %s and some more",
        '"filler"',
        "str is filler and some more",
    ),
    _format("percent escaping", "%% and also %%", "", "% and also %"),
    _format("substution inside escaped percent signs", "%%%s%%", '"text"', "%text%"),
    _format(
        "substitution with one escaped percent sign on the right",
        "%s%%",
        '"percent on the right"',
        "percent on the right%",
    ),
    _format(
        "substitution with one escaped percent sign on the left",
        "%%%s",
        '"percent on the left"',
        "%percent on the left",
    ),
    _format(
        "multiple substitutions",
        "%d %d %d, %s %s %s, %d %d %d, %s %s %s",
        '1, 2, 3, "A", "B", "C", 4, 5, 6, "D", "E", "F"',
        "1 2 3, A B C, 4 5 6, D E F",
    ),
    _format(
        "percent sign escape sequence support", "%%escaped %s%%", '"percent"', "%escaped percent%"
    ),
    _format("fixed point formatting clause", "%.3f", "1.2345", "1.234"),
    _format("binary formatting clause", "this is 5 in binary: %b", "5", "this is 5 in binary: 101"),
    _format(
        "negative binary formatting clause",
        "this is -5 in binary: %b",
        "-5",
        "this is -5 in binary: -101",
    ),
    _format(
        "uint support for binary formatting",
        "unsigned 64 in binary: %b",
        "uint(64)",
        "unsigned 64 in binary: 1000000",
    ),
    _format(
        "bool support for binary formatting",
        "bit set from bool: %b",
        "true",
        "bit set from bool: 1",
    ),
    _format("octal formatting clause", "%o", "11", "13"),
    _format("negative octal formatting clause", "%o", "-11", "-13"),
    _format(
        "uint support for octal formatting clause",
        "this is an unsigned octal: %o",
        "uint(65535)",
        "this is an unsigned octal: 177777",
    ),
    _format(
        "lowercase hexadecimal formatting clause",
        "%x is 30 in hexadecimal",
        "30",
        "1e is 30 in hexadecimal",
    ),
    _format(
        "uppercase hexadecimal formatting clause",
        "%X is 20 in hexadecimal",
        "30",
        "1E is 20 in hexadecimal",
    ),
    _format(
        "negative hexadecimal formatting clause",
        "%x is -30 in hexadecimal",
        "-30",
        "-1e is -30 in hexadecimal",
    ),
    _format(
        "unsigned support for hexadecimal formatting clause",
        "%X is 6000 in hexadecimal",
        "uint(6000)",
        "1770 is 6000 in hexadecimal",
    ),
    _format(
        "string support with hexadecimal formatting clause",
        "%x",
        '"Hello world!"',
        "48656c6c6f20776f726c6421",
    ),
    _format(
        "string support with uppercase hexadecimal formatting clause",
        "%X",
        '"Hello world!"',
        "48656C6C6F20776F726C6421",
    ),
    _format(
        "byte support with hexadecimal formatting clause",
        "%x",
        'b"byte string"',
        "6279746520737472696e67",
    ),
    _format(
        "byte support with hexadecimal formatting clause leading zero",
        "%x",
        'b"\\x00\\x00byte string\\x00"',
        "00006279746520737472696e6700",
    ),
    _format(
        "byte support with uppercase hexadecimal formatting clause",
        "%X",
        'b"byte string"',
        "6279746520737472696E67",
    ),
    _format(
        "scientific notation formatting clause",
        "%.6e",
        "1052.032911275",
        "1.052033\u202f\u00d7\u202f10\u2070\u00b3",
    ),
    _format("default precision for fixed-point clause", "%f", "2.71828", "2.718280"),
    _format(
        "default precision for scientific notation",
        "%e",
        "2.71828",
        "2.718280\u202f\u00d7\u202f10\u2070\u2070",
    ),
    _format("default precision for string", "%s", "2.71", "2.71"),
    _format("default list precision for string", "%s", "[2.71]", "[2.710000]"),
    _format("default scientific notation for string", "%s", "0.000000002", "2e-09"),
    _format("default list scientific notation for string", "%s", "[0.000000002]", "[0.000000]"),
    _format("NaN support for fixed-point", "%f", '"NaN"', "NaN"),
    _format("positive infinity support for fixed-point", "%f", '"Infinity"', "∞"),
    _format("negative infinity support for fixed-point", "%f", '"-Infinity"', "-∞"),
    _format("NaN support for string", "%s", 'double("NaN")', "NaN"),
    _format("positive infinity support for string", "%s", 'double("Inf")', "+Inf"),
    _format("negative infinity support for string", "%s", 'double("-Inf")', "-Inf"),
    _format(
        "infinity list support for string",
        "%s",
        '[double("NaN"),double("+Inf"), double("-Inf")]',
        '["NaN", "+Inf", "-Inf"]',
    ),
    _format("uint support for decimal clause", "%d", "uint(64)", "64"),
    _format("null support for string", "null: %s", "null", "null: null"),
    _format("int support for string", "%s", "999999999999", "999999999999"),
    _format("bytes support for string", "some bytes: %s", 'b"xyz"', "some bytes: xyz"),
    _format(
        "type() support for string",
        "type is %s",
        'type("test string")',
        "type is string",
        celpy=NO_LOCALE_PRINTER,
    ),
    _format(
        "timestamp support for string",
        "%s",
        'timestamp("2023-02-03T23:31:20+00:00")',
        "2023-02-03T23:31:20Z",
    ),
    _format("duration support for string", "%s", 'duration("1h45m47s")', "6347s"),
    _format(
        "boolean support for %s",
        "true bool: %s, false bool: %s",
        "true, false",
        "true bool: true, false bool: false",
    ),
    _format_error(
        "unrecognized formatting clause",
        "%a",
        "1",
        'could not parse formatting clause: unrecognized formatting clause "a"',
        compile_time=True,
    ),
    _format_error(
        "out of bounds arg index", "%d %d %d", "0, 1", "index 2 out of range", compile_time=True
    ),
    _format_error(
        "string substitution is not allowed with binary clause",
        "string is %b",
        '"abc"',
        "error during formatting: "
        "only integers and bools can be formatted as binary, was given string",
        compile_time=True,
    ),
    _format_error(
        "duration substitution not allowed with decimal clause",
        "%d",
        'duration("30m2s")',
        "error during formatting: "
        "decimal clause can only be used on integers, was given google.protobuf.Duration",
        compile_time=True,
    ),
    _format_error(
        "double substitution not allowed with hex clause",
        "double is %x",
        "0.5",
        "error during formatting: "
        "only integers, byte buffers, and strings can be formatted as hex, was given double",
        compile_time=True,
    ),
    _format_error(
        "uppercase not allowed for scientific clause",
        "double is %E",
        "0.5",
        'could not parse formatting clause: unrecognized formatting clause "E"',
        compile_time=True,
    ),
    _format_error(
        "null not allowed for %d",
        "null: %d",
        "null",
        "error during formatting: decimal clause can only be used on integers, was given null_type",
        compile_time=True,
    ),
    _format_error(
        "null not allowed for %e",
        "null: %e",
        "null",
        "error during formatting: "
        "scientific clause can only be used on doubles, was given null_type",
        compile_time=True,
    ),
    _format_error(
        "null not allowed for %b",
        "null: %b",
        "null",
        "error during formatting: "
        "only integers and bools can be formatted as binary, was given null_type",
        compile_time=True,
    ),
    _format_error(
        "compile-time cardinality check (too few for string)",
        "%s %s",
        '"abc"',
        "index 1 out of range",
        compile_time=True,
    ),
    _format_error(
        "compile-time cardinality check (too many for string)",
        "%s %s",
        '"abc", "def", "ghi"',
        "too many arguments supplied to string.format (expected 2, got 3)",
        compile_time=True,
        celpy=Deviation(
            f"{NO_TYPE_CHECKER}: only the checker counts arguments, the formatter ignores extras",
            result=False,
        ),
    ),
    _format_error(
        "compile-time syntax check (unexpected end of string)",
        "filler %",
        "",
        "unexpected end of string",
        compile_time=True,
    ),
    _format_error(
        "compile-time precision syntax check",
        "double is %.34",
        "5.0",
        "could not parse formatting clause: "
        "error while parsing precision: could not find end of precision specifier",
        compile_time=True,
    ),
    _format_error(
        "compile-time %f check",
        "double is %f",
        "true",
        "error during formatting: fixed-point clause can only be used on doubles",
        compile_time=True,
    ),
    _format_error(
        "compile-time %o check",
        "an octal: %o",
        "3.14",
        "error during formatting: octal clause can only be used on integers",
        compile_time=True,
    ),
    # the same clauses on dyn arguments: no compile-time check, the error at run time
    _format_error(
        "string substitution is not allowed with binary clause (dyn)",
        "string is %b",
        'dyn("abc")',
        "error during formatting: "
        "only integers and bools can be formatted as binary, was given string",
        compile_time=False,
    ),
    _format_error(
        "null not allowed for %o (dyn)",
        "null: %o",
        "dyn(null)",
        "error during formatting: octal clause can only be used on integers, was given null_type",
        compile_time=False,
    ),
)

FORMAT_COSTS = tuple(
    CostCase(
        f"TestStringFormat/{name}",
        f"{quote_plain(fmt)}.format([{args}])",
        cost,
        actual,
        f"{FORMAT_TEST}/{name}",
    )
    for name, fmt, args, cost, actual in (
        ("no-op", "no substitution", "", (12, 12), 12),
        ("fixed point formatting clause", "%.3f", "1.2345", (11, 11), 11),
        ("binary formatting clause", "this is 5 in binary: %b", "5", (13, 13), 13),
        (
            "uint support for binary formatting",
            "unsigned 64 in binary: %b",
            "uint(64)",
            (14, 14),
            14,
        ),
        ("octal formatting clause", "%o", "11", (11, 11), 11),
        ("string support with hexadecimal formatting clause", "%x", '"Hello world!"', (11, 11), 11),
        ("default list precision for string", "%s", "[2.71]", (21, 21), 21),
        ("bytes support for string", "some bytes: %s", 'b"xyz"', (12, 12), 12),
        ("type() support for string", "type is %s", 'type("test string")', (12, 12), 12),
    )
)

QUOTE_COSTS = tuple(
    CostCase(
        f"TestQuoteUnquote/{name}",
        f"strings.quote({quote_plain(text)})",
        (cost, cost),
        cost,
        f"{STRINGS_TEST} TestQuoteUnquote/{name}",
    )
    for name, text, cost in (
        ("remove quotes only", "this is a test", 2),
        ("mid-string newline", "first\nsecond", 2),
        ("bell", "bell\a", 1),
        ("backspace", "\bbackspace", 1),
        ("form feed", "\fform feed", 1),
        ("carriage return", "carriage \r return", 2),
        ("horizontal tab", "horizontal \ttab", 2),
        ("vertical tab", "vertical \v tab", 2),
        ("double slash", "double \\\\ slash", 2),
        ("two escape sequences", "two escape sequences \a\n", 3),
        ("ends with slash", "ends with \\", 2),
        ("starts with slash", "\\ starts with", 2),
        ("printable unicode", "printable unicode😀", 2),
        ("mid-string quote", 'mid-string " quote', 2),
        ("single-quote with double quote", 'single-quote with "double quote"', 4),
        (
            "test cost",
            "this is a very very very long string used to ensure that cost tracking works",
            8,
        ),
    )
)

CASES: tuple[Case, ...] = STRINGS + VERSIONS + REGEX + FORMAT
COST_CASES: tuple[CostCase, ...] = FORMAT_COSTS + QUOTE_COSTS
