"""A CEL parser of biaxial's own, for what cel-cpp's parser cannot be asked: the spans of an
expression's parts (to rewrite the source before cel-cpp compiles it) and the nesting depth
upstream's parser measures.

It follows cel-go's grammar (``parser/gen/CEL.g4``) rule for rule and counts, as cel-go does,
the depth of every grammar rule while parsing (its ``recursionListener``: the left-recursive
``relation``, ``calc`` and ``member`` rules nest once per operator) and the depth of the
visitor that builds the AST (``checkAndIncrementRecursionDepth``: ternaries, relations,
arithmetic, selections, member calls and indexes). Upstream refuses an expression where
either passes 250; cel-cpp has the same two measures with a limit of 32 that
cel-expr-python does not let biaxial raise (``driver.cel.deep`` works around it).

It is not a validator: cel-cpp still parses and checks every expression. This parser only has
to be right on expressions cel-go accepts; on anything else it raises :class:`CELSyntaxError`
and the caller reports cel-cpp's own error. Pure module.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Final

UPSTREAM_MAX_DEPTH: Final = 250  # cel-go's parser.MaxRecursionDepth default, Kubernetes keeps it
UPSTREAM_VISITOR_MESSAGE: Final = "max recursion depth exceeded"


class CELSyntaxError(Exception):
    """The source is not an expression this parser reads."""


# --------------------------------------------------------------------------- lexer


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "int" "uint" "double" "string" "bytes" "ident" "escident" "op" "eof"
    text: str
    start: int
    end: int


_SPACE: Final = re.compile(r"(?:[\t \r\n\f]+|//[^\n]*)+")
_NUMBER: Final = re.compile(
    r"(?P<double>[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<uint>(?:0x[0-9a-fA-F]+|[0-9]+)[uU])"
    r"|(?P<int>0x[0-9a-fA-F]+|[0-9]+)"
)
_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESC_IDENT: Final = re.compile(r"`[A-Za-z0-9_./ -]+`")
_OPERATORS: Final = ("==", "!=", "<=", ">=", "&&", "||", *"<>[]{}().,-!?:+*/%")
_QUOTES: Final = ('"""', "'''", '"', "'")


def _string_end(source: str, at: int, raw: bool) -> int:
    """The offset after the string literal whose quote starts at *at*."""
    quote = next(q for q in _QUOTES if source.startswith(q, at))
    i = at + len(quote)
    while i < len(source):
        if source.startswith(quote, i):
            return i + len(quote)
        ch = source[i]
        if len(quote) == 1 and ch in "\r\n":
            break
        i += 2 if ch == "\\" and not raw else 1
    raise CELSyntaxError(f"unterminated string at {at}")


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(source)
    while True:
        space = _SPACE.match(source, i)
        if space:
            i = space.end()
        if i >= n:
            tokens.append(Token("eof", "", n, n))
            return tokens
        ch = source[i]
        prefix = 0
        lowered = source[i : i + 2].lower()
        if lowered in ("br", "rb") and lowered == "br" and source[i + 2 : i + 3] in ("'", '"'):
            prefix = 2
        elif ch in "rRbB" and source[i + 1 : i + 2] in ("'", '"'):
            prefix = 1
        if ch in "'\"" or prefix:
            raw = "r" in source[i : i + prefix].lower()
            end = _string_end(source, i + prefix, raw)
            kind = "bytes" if "b" in source[i : i + prefix].lower() else "string"
            tokens.append(Token(kind, source[i:end], i, end))
            i = end
            continue
        number = _NUMBER.match(source, i) if ch.isdigit() or ch == "." else None
        if number and (ch != "." or number.lastgroup == "double"):
            kind = number.lastgroup or "int"
            tokens.append(Token(kind, number.group(), i, number.end()))
            i = number.end()
            continue
        ident = _IDENT.match(source, i)
        if ident:
            tokens.append(Token("ident", ident.group(), i, ident.end()))
            i = ident.end()
            continue
        escaped = _ESC_IDENT.match(source, i)
        if escaped:
            tokens.append(Token("escident", escaped.group(), i, escaped.end()))
            i = escaped.end()
            continue
        op = next((o for o in _OPERATORS if source.startswith(o, i)), None)
        if op is None:
            raise CELSyntaxError(f"unexpected character {ch!r} at {i}")
        tokens.append(Token("op", op, i, i + len(op)))
        i += len(op)


# --------------------------------------------------------------------------- syntax tree


@dataclass(slots=True, eq=False)
class Node:
    """One part of the expression: its *kind*, its span ``[start, end)`` in the source, its
    parts, and a *name* (identifier, field, function or operator).

    Kinds: ``literal``, ``ident``, ``select`` (parts: operand), ``call`` (parts: the target if
    ``receiver``, then the arguments), ``index`` (operand, index), ``list``, ``map`` (key, value,
    key, value, ...), ``message`` (field values), ``unary`` (operand; name: the operators),
    ``binary`` (left, right), ``and`` / ``or`` (terms), ``ternary`` (condition, then, else),
    ``paren`` (the parenthesised expression)."""

    kind: str
    start: int
    end: int
    parts: list[Node] = field(default_factory=list)
    name: str = ""
    receiver: bool = False
    optional: bool = False


_RELATIONS: Final = frozenset({"<", "<=", ">=", ">", "==", "!=", "in"})
_MULTIPLICATIVE: Final = frozenset({"*", "/", "%"})
_ADDITIVE: Final = frozenset({"+", "-"})


@dataclass(frozen=True, slots=True)
class Parsed:
    root: Node
    rule_depth: int  # the deepest any one grammar rule nested (cel-go's recursionListener)
    visitor_depth: int  # the deepest the AST builder recursed (cel-go's visitor)
    limit: int = UPSTREAM_MAX_DEPTH

    @property
    def upstream_problem(self) -> str | None:
        """Upstream's parse error for an expression nested too deeply, or None."""
        if self.rule_depth > self.limit:
            return f"expression recursion limit exceeded: {self.limit}"
        if self.visitor_depth > self.limit:
            return UPSTREAM_VISITOR_MESSAGE
        return None


# Python frames per nesting level of the grammar (expr .. primary) with room to spare: a parse
# stops one level past upstream's limit, so this bounds the recursion (Python 3.11 and later
# keep pure-Python recursion off the C stack).
_RECURSION_LIMIT: Final = 12 * (UPSTREAM_MAX_DEPTH + 2) + 1000


class _TooDeepError(Exception):
    pass


def parse(source: str, limit: int = UPSTREAM_MAX_DEPTH) -> Parsed:
    """The syntax tree of *source* and its nesting depths; an expression nested past *limit*
    (upstream's) parses no further (its ``upstream_problem`` says so)."""
    if sys.getrecursionlimit() < _RECURSION_LIMIT:
        sys.setrecursionlimit(_RECURSION_LIMIT)
    parser = _Parser(source, min(limit, UPSTREAM_MAX_DEPTH))
    try:
        root = parser.start()
    except _TooDeepError:
        return Parsed(Node("literal", 0, len(source)), limit + 1, 0, limit)
    return Parsed(root, parser.max_rule, visitor_depth(root), limit)


def visitor_depth(root: Node) -> int:
    """cel-go's visitor recursion: ternaries, relations, arithmetic, selections, member calls
    and indexes each count one level (logical operators, negation, global calls, literals and
    parentheses do not)."""
    deepest = 0
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        counts = node.kind in ("ternary", "binary", "select", "index") or (
            node.kind == "call" and node.receiver
        )
        depth += counts
        deepest = max(deepest, depth)
        stack.extend((part, depth) for part in node.parts)
    return deepest


class _Parser:
    """Recursive descent over cel-go's grammar, one method per rule, counting rule depths as
    ANTLR's parse listener sees them."""

    def __init__(self, source: str, limit: int) -> None:
        self.tokens = tokenize(source)
        self.limit = limit
        self.at = 0
        self.depth: dict[str, int] = {}
        self.max_rule = 0

    # ------------------------------------------------------------------ plumbing

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.at + offset, len(self.tokens) - 1)]

    def is_op(self, text: str, offset: int = 0) -> bool:
        token = self.peek(offset)
        return token.kind == "op" and token.text == text

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def expect(self, text: str) -> Token:
        if not self.is_op(text):
            raise CELSyntaxError(f"expected {text!r} at {self.peek().start}")
        return self.take()

    def enter(self, rule: str, times: int = 1) -> None:
        depth = self.depth.get(rule, 0) + times
        self.depth[rule] = depth
        self.max_rule = max(self.max_rule, depth)
        if depth > self.limit:
            raise _TooDeepError

    def exit(self, rule: str, times: int = 1) -> None:
        self.depth[rule] -= times

    # ------------------------------------------------------------------ rules

    def start(self) -> Node:
        self.enter("start")
        node = self.expr()
        if self.peek().kind != "eof":
            raise CELSyntaxError(f"unexpected {self.peek().text!r} at {self.peek().start}")
        self.exit("start")
        return node

    def expr(self) -> Node:
        self.enter("expr")
        node = self.conditional_or()
        if self.is_op("?"):
            self.take()
            then = self.conditional_or()
            self.expect(":")
            other = self.expr()
            node = Node("ternary", node.start, other.end, [node, then, other])
        self.exit("expr")
        return node

    def conditional_or(self) -> Node:
        self.enter("conditionalOr")
        terms = [self.conditional_and()]
        while self.is_op("||"):
            self.take()
            terms.append(self.conditional_and())
        self.exit("conditionalOr")
        return terms[0] if len(terms) == 1 else Node("or", terms[0].start, terms[-1].end, terms)

    def conditional_and(self) -> Node:
        self.enter("conditionalAnd")
        terms = [self.relation(0)]
        while self.is_op("&&"):
            self.take()
            terms.append(self.relation(0))
        self.exit("conditionalAnd")
        return terms[0] if len(terms) == 1 else Node("and", terms[0].start, terms[-1].end, terms)

    def _relation_op(self) -> str | None:
        token = self.peek()
        if (token.kind == "op" and token.text in _RELATIONS) or (
            token.kind == "ident" and token.text == "in"
        ):
            return token.text
        return None

    def relation(self, precedence: int) -> Node:
        self.enter("relation")
        node = self.calc(0)
        while precedence <= 1 and (op := self._relation_op()) is not None:
            self.take()
            right = self.relation(2)
            node = Node("binary", node.start, right.end, [node, right], name=op)
        self.exit("relation")
        return node

    def calc(self, precedence: int) -> Node:
        self.enter("calc")
        node = self.unary()
        while True:
            token = self.peek()
            if token.kind != "op":
                break
            if token.text in _MULTIPLICATIVE and precedence <= 2:
                right_precedence = 3
            elif token.text in _ADDITIVE and precedence <= 1:
                right_precedence = 2
            else:
                break
            self.take()
            right = self.calc(right_precedence)
            node = Node("binary", node.start, right.end, [node, right], name=token.text)
        self.exit("calc")
        return node

    def unary(self) -> Node:
        self.enter("unary")
        start = self.peek().start
        ops = ""
        if self.is_op("!"):
            while self.is_op("!"):
                ops += self.take().text
        elif self.is_op("-") and self.peek(1).kind not in ("int", "double"):
            while self.is_op("-"):
                ops += self.take().text
        node = self.member()
        if ops:
            node = Node("unary", start, node.end, [node], name=ops)
        self.exit("unary")
        return node

    def member(self) -> Node:
        self.enter("member")
        node = self.primary()
        while True:
            if self.is_op("."):
                self.take()
                optional = self.is_op("?")
                if optional:
                    self.take()
                if not optional and self.peek().kind == "ident" and self.is_op("(", 1):
                    name = self.take().text
                    self.take()
                    args = self.expr_list(")")
                    end = self.expect(")").end
                    node = Node("call", node.start, end, [node, *args], name=name, receiver=True)
                else:
                    name, end = self.escape_ident()
                    node = Node("select", node.start, end, [node], name=name, optional=optional)
            elif self.is_op("["):
                self.take()
                optional = self.is_op("?")
                if optional:
                    self.take()
                index = self.expr()
                end = self.expect("]").end
                node = Node("index", node.start, end, [node, index], optional=optional)
            else:
                break
        self.exit("member")
        return node

    def escape_ident(self) -> tuple[str, int]:
        self.enter("escapeIdent")
        token = self.peek()
        if token.kind not in ("ident", "escident"):
            raise CELSyntaxError(f"expected a field name at {token.start}")
        self.take()
        self.exit("escapeIdent")
        return token.text, token.end

    def primary(self) -> Node:
        self.enter("primary")
        token = self.peek()
        start = token.start
        node: Node
        if token.kind == "ident" or (self.is_op(".") and self.peek(1).kind == "ident"):
            node = self.identifier_primary()
        elif self.is_op("("):
            self.take()
            inner = self.expr()
            end = self.expect(")").end
            node = Node("paren", start, end, [inner])
        elif self.is_op("["):
            self.take()
            elements = self.list_init() if not self.is_op("]") and not self.is_op(",") else []
            if self.is_op(","):
                self.take()
            end = self.expect("]").end
            node = Node("list", start, end, elements)
        elif self.is_op("{"):
            self.take()
            entries = self.map_init() if not self.is_op("}") and not self.is_op(",") else []
            if self.is_op(","):
                self.take()
            end = self.expect("}").end
            node = Node("map", start, end, entries)
        else:
            node = self.literal()
        self.exit("primary")
        return node

    def identifier_primary(self) -> Node:
        start = self.peek().start
        dotted = self.is_op(".")
        if dotted:
            self.take()
        # A qualified name followed by '{' is a message; otherwise an identifier or a call.
        ahead = 1
        while self.is_op(".", ahead) and self.peek(ahead + 1).kind == "ident":
            ahead += 2
        if self.is_op("{", ahead):
            parts = [token.text for token in self.tokens[self.at : self.at + ahead : 2]]
            self.at += ahead + 1  # the qualified name and '{'
            fields = self.field_init() if not self.is_op("}") and not self.is_op(",") else []
            if self.is_op(","):
                self.take()
            end = self.expect("}").end
            return Node("message", start, end, fields, name="." * dotted + ".".join(parts))
        token = self.take()
        name = "." * dotted + token.text
        if token.text in ("true", "false", "null"):
            if dotted:
                raise CELSyntaxError(f"unexpected {token.text!r}")
            self.enter("literal")
            self.exit("literal")
            return Node("literal", start, token.end, name=token.text)
        if self.is_op("("):
            self.take()
            args = self.expr_list(")")
            end = self.expect(")").end
            return Node("call", start, end, args, name=name)
        return Node("ident", start, token.end, name=name)

    def expr_list(self, closing: str) -> list[Node]:
        if self.is_op(closing):
            return []
        self.enter("exprList")
        items = [self.expr()]
        while self.is_op(","):
            self.take()
            items.append(self.expr())
        self.exit("exprList")
        return items

    def opt_expr(self) -> Node:
        self.enter("optExpr")
        optional = self.is_op("?")
        if optional:
            self.take()
        node = self.expr()
        self.exit("optExpr")
        if optional:
            node.optional = True
        return node

    def list_init(self) -> list[Node]:
        self.enter("listInit")
        items = [self.opt_expr()]
        while self.is_op(",") and not self.is_op("]", 1):
            self.take()
            items.append(self.opt_expr())
        self.exit("listInit")
        return items

    def map_init(self) -> list[Node]:
        self.enter("mapInitializerList")
        entries: list[Node] = []
        while True:
            entries.append(self.opt_expr())
            self.expect(":")
            entries.append(self.expr())
            if not self.is_op(",") or self.is_op("}", 1):
                break
            self.take()
        self.exit("mapInitializerList")
        return entries

    def field_init(self) -> list[Node]:
        self.enter("fieldInitializerList")
        values: list[Node] = []
        while True:
            self.enter("optField")
            if self.is_op("?"):
                self.take()
            self.escape_ident()
            self.exit("optField")
            self.expect(":")
            values.append(self.expr())
            if not self.is_op(",") or self.is_op("}", 1):
                break
            self.take()
        self.exit("fieldInitializerList")
        return values

    def literal(self) -> Node:
        self.enter("literal")
        start = self.peek().start
        if self.is_op("-") and self.peek(1).kind in ("int", "double"):
            self.take()
        token = self.take()
        if token.kind not in ("int", "uint", "double", "string", "bytes"):
            raise CELSyntaxError(f"unexpected {token.text!r} at {token.start}")
        self.exit("literal")
        return Node("literal", start, token.end, name=token.text)


# --------------------------------------------------------------------------- macros

# Receiver macros by name: the argument counts at which they bind variables, and how many.
_RECEIVER_MACROS: Final = {
    "all": {2: 1, 3: 2},
    "exists": {2: 1, 3: 2},
    "exists_one": {2: 1, 3: 2},
    "existsOne": {2: 1, 3: 2},
    "map": {2: 1, 3: 1},
    "filter": {2: 1},
    "transformList": {3: 2, 4: 2},
    "transformMap": {3: 2, 4: 2},
    "transformMapEntry": {3: 2, 4: 2},
    "sortBy": {2: 1},
    "optMap": {2: 1},
    "optFlatMap": {2: 1},
}


def macro_variables(node: Node) -> int:
    """How many leading arguments of *node* (after its target) are variable names a macro
    binds; 0 for a node that is no macro call. ``cel.bind(x, init, body)`` binds one."""
    if node.kind != "call":
        return 0
    args = node.parts[1:] if node.receiver else node.parts
    if node.receiver and node.name == "bind" and len(args) == 3:
        target = node.parts[0]
        if target.kind == "ident" and target.name == "cel":
            return 1 if args[0].kind == "ident" else 0
    if not node.receiver:
        return 0
    count = _RECEIVER_MACROS.get(node.name, {}).get(len(args), 0)
    if all(a.kind == "ident" for a in args[:count]):
        return count
    return 0


def walk(root: Node) -> list[Node]:
    """Every node, parents before children."""
    out: list[Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.parts))
    return out


def two_variable_exists_one(source: str) -> str:
    """*source* with each ``.exists_one(i, v, p)`` -- cel-go's two-variable form, which
    cel-cpp knows only as ``existsOne`` -- renamed in place (same length: ``existsOne `` with a
    space before the parenthesis, so that every offset stays the same)."""
    if "exists_one" not in source:
        return source
    try:
        root = parse(source).root
    except CELSyntaxError:
        return source
    out = list(source)
    for node in walk(root):
        if (
            node.kind == "call"
            and node.receiver
            and node.name == "exists_one"
            and len(node.parts) == 4
        ):
            at = source.index("exists_one", node.parts[0].end)
            out[at : at + len("exists_one")] = "existsOne "
    return "".join(out)
