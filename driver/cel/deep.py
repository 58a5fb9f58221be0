"""Expressions nested deeper than cel-cpp allows: upstream parses up to 250 levels, cel-cpp's
parser stops at 32 (a limit cel-expr-python does not expose), and cel-expr-python loads a
checked expression only up to protobuf's 100 nested messages (about 48 nested calls).

Both limits are met the same way, by *hoisting*: parts of a deep expression move into lazy
``cel.bind`` values so that no part nests deeply, and the whole still computes the same value
in the same order -- a bound value is read exactly once, where the part was, and cel-cpp
evaluates a bind's value lazily, when first read (so a part under ``&&``, ``?:`` or an
unreached branch runs only if it did before). Inside a comprehension's per-iteration parts
(its condition, step and result; a macro's predicate and transform) the binds stay inside, so
a part is evaluated once per iteration as before.

* :func:`hoist_source` rewrites the *source* (for cel-cpp's parser and checker), and
  :func:`inline` undoes it in the checked expression, which then has the original's shape
  (upstream's cost estimate and the compile-time rules see the expression as written);
* :func:`shallow` hoists in a *checked* expression (for loading it as a program) and leaves
  expressions within the limit untouched.

A *piece* is what stays in place after hoisting; pieces are at most ``piece`` levels high. The
pieces along a deep path form a chain, and a chain of ``k`` pieces is bound as a balanced tree
(``cel.bind(h_m, <first half>, <second half>)``), so that the binds add ``log2(k)`` levels
rather than ``k``. Pure module.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from driver.cel import checked, syntax

MESSAGE_DEPTH_LIMIT: Final = 90  # nested protobuf messages cel-expr-python loads (100), less room


@dataclass(slots=True, eq=False)
class _P:
    """A node of the tree being hoisted (a syntax.Node or a checked Expr, as ``ref``)."""

    ref: Any
    kids: list[_P] = field(default_factory=list)
    weight: int = 1  # the levels the node itself adds
    cuttable: bool = True
    region: bool = False  # a comprehension's (macro's) part that binds names
    binds: frozenset[str] = frozenset()  # the names a region binds
    free: frozenset[str] = frozenset()  # the names the subtree reads and does not bind
    height: int = 0
    cut: bool = False
    owned: list[_P] = field(default_factory=list)  # the cuts bound here
    hole_cuts: list[_P] = field(default_factory=list)  # the nearest cuts in this piece
    hole_regions: list[_P] = field(default_factory=list)  # the nearest regions that bind cuts
    composed: int = 0  # the height of the bound form, estimated


def _post_order(root: _P) -> Iterator[_P]:
    stack: list[tuple[_P, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        stack.append((node, True))
        stack.extend((kid, False) for kid in reversed(node.kids))


def _log2_ceil(n: int) -> int:
    return max(0, (n - 1).bit_length())


def _plan(root: _P, piece: int, bind_weight: int, *, strict: bool) -> None:
    """Choose the cuts and where each is bound.

    Cuts: bottom up, a node whose height passes *piece* has its highest cuttable parts cut
    until it fits (a cut part counts as one level: the name that stays in its place).

    Binding: a cut is bound at its nearest enclosing cut, or at the nearest enclosing region
    that binds a name the cut reads (it must stay in that name's scope), or at the root. With
    *strict*, a region binds every cut inside it: a part evaluated in each iteration stays
    evaluated in each iteration (for an expression that charges its cost as it runs)."""
    root.region = True
    for node in _post_order(root):
        heights = {id(kid): (1 if kid.cut else kid.height) for kid in node.kids}
        while node.kids and node.weight + max(heights.values()) > piece:
            tallest = max(node.kids, key=lambda k: heights[id(k)])
            if not tallest.cuttable or tallest.cut:
                break  # this node is cut instead, by its parent
            tallest.cut = True
            heights[id(tallest)] = 1
        node.height = node.weight + max(heights.values(), default=0)
    tops = [n for n in _post_order(root) if n.cut or n.region]
    for top in tops:
        top.owned = _owned(top, anchor=top.cut or top is root, strict=strict)
    for top in tops:
        top.hole_cuts, top.hole_regions = _frontier(top)
        chain = _chain(top)
        lights = sum(len(c.owned) - 1 for c in chain[:-1])
        top.composed = top.height + bind_weight * (_log2_ceil(len(chain)) + lights)


def _owned(top: _P, *, anchor: bool, strict: bool) -> list[_P]:
    """The cuts bound at *top*: below it, not below another cut, and not reading a name a
    region between binds. A cut or the root (an *anchor*) binds them all; a region only those
    that read its own names (the others go further out), or all of them when *strict*."""
    owned = []
    stack: list[tuple[_P, frozenset[str]]] = [(kid, frozenset()) for kid in reversed(top.kids)]
    while stack:
        node, crossed = stack.pop()
        if node.cut:
            if not node.free & crossed and (anchor or strict or node.free & top.binds):
                owned.append(node)
            continue
        if node.region:
            if strict:
                continue
            crossed = crossed | node.binds
        stack.extend((kid, crossed) for kid in reversed(node.kids))
    return owned


def _frontier(top: _P) -> tuple[list[_P], list[_P]]:
    """The nearest cuts and the nearest regions that bind cuts, in *top*'s piece."""
    cuts: list[_P] = []
    regions: list[_P] = []
    stack = list(reversed(top.kids))
    while stack:
        node = stack.pop()
        if node.cut:
            cuts.append(node)
        elif node.region and node.owned:
            regions.append(node)
        else:
            stack.extend(reversed(node.kids))
    return cuts, regions


def _heavy(node: _P) -> _P | None:
    return max(node.owned, key=lambda c: c.composed, default=None)


def _chain(top: _P) -> list[_P]:
    """*top* and its heavy cut, that one's heavy cut, ... (top first)."""
    chain = [top]
    while (nxt := _heavy(chain[-1])) is not None:
        chain.append(nxt)
    return chain


class _Composer:
    """Builds the bound form of a planned tree; the emitters say how to write a piece (a node
    with its holes filled), a name and a bind."""

    def __init__(
        self,
        name: Callable[[], str],
        piece: Callable[[_P, dict[int, tuple[str, Any]]], Any],
        bind: Callable[[str, Any, Any], Any],
    ) -> None:
        self.new_name = name
        self.piece = piece
        self.bind = bind
        self.names: dict[int, str] = {}

    def name(self, node: _P) -> str:
        if id(node) not in self.names:
            self.names[id(node)] = self.new_name()
        return self.names[id(node)]

    def compose(self, top: _P) -> Any:
        chain = _chain(top)
        pieces: list[Any] = []  # deepest first
        for i in range(len(chain) - 1, -1, -1):
            node = chain[i]
            heavy = chain[i + 1] if i + 1 < len(chain) else None
            # Everything below this piece first: an emitter may fill the holes in place.
            lights = [(self.name(c), self.compose(c)) for c in node.owned if c is not heavy]
            holes: dict[int, tuple[str, Any]] = {}
            for r in node.hole_regions:
                holes[id(r)] = ("value", self.compose(r))
            for c in node.hole_cuts:
                holes[id(c)] = ("name", self.name(c))
            value = self.piece(node, holes)
            for name, light in reversed(lights):
                value = self.bind(name, light, value)
            pieces.append(value)
        names = [self.name(node) for node in reversed(chain)]
        return self._balanced(pieces, names, 0, len(pieces) - 1)

    def _balanced(self, pieces: list[Any], names: list[str], i: int, j: int) -> Any:
        """The value of piece j with piece i-1's value bound (pieces deepest first): the
        first half bound to its name around the second half, recursively."""
        if i == j:
            return pieces[i]
        m = (i + j) // 2
        return self.bind(
            names[m],
            self._balanced(pieces, names, i, m),
            self._balanced(pieces, names, m + 1, j),
        )


# --------------------------------------------------------------------------- source level


@dataclass(frozen=True, slots=True)
class Hoisted:
    text: str  # the rewritten source
    prefix: str  # the prefix of every name it binds


def _syntax_tree(node: syntax.Node, scope: frozenset[str]) -> _P:
    """The hoisting tree of a parsed expression; *scope*: the macro variables around it."""
    p = _P(node)
    bound = syntax.macro_variables(node)
    first = 1 if node.kind == "call" and node.receiver else 0
    names = frozenset(n.name for n in node.parts[first : first + bound])
    free: set[str] = set()
    for i, part in enumerate(node.parts):
        is_name = bound and first <= i < first + bound
        is_body = bound and i >= first + bound
        kid = _syntax_tree(part, scope | names if is_body else scope)
        if is_body:
            kid.region = True
            kid.binds = names
            # Out of the macro only if it reads none of the macro's variables (its own
            # binds, for its inner parts that do, stay inside it).
            kid.cuttable = kid.cuttable and not kid.free & names
            free |= kid.free - names
        elif not is_name:
            free |= kid.free
        if is_name or (node.kind == "call" and not node.receiver and node.name == "has"):
            kid.cuttable = False  # a macro's variable; has() takes a selection as written
        if node.kind == "call" and node.receiver and i == 0 and part.kind == "ident":
            kid.cuttable = False  # a namespace (cel.bind, sets.contains, ...) or a receiver
        p.kids.append(kid)
    if node.kind == "ident":
        free.add(node.name)
    p.free = frozenset(free)
    root = _qualified_root(node) if node.kind == "select" else None
    if node.kind in ("ident", "literal") or (root is not None and root not in scope):
        p.cuttable = False  # nothing to gain, or a name the checker resolves as written
    return p


def _qualified_root(node: syntax.Node) -> str | None:
    """The identifier a chain of selections starts from, or None (the chain starts from an
    expression)."""
    while node.kind == "select":
        node = node.parts[0]
    return node.name if node.kind == "ident" else None


def hoist_source(source: str, parsed: syntax.Parsed, piece: int) -> Hoisted:
    """*source* with its deep parts bound to names (see the module doc)."""
    prefix = "bx_deep"
    while prefix in source:
        prefix += "_"
    counter = iter(range(1 << 30))
    root = _syntax_tree(parsed.root, frozenset())
    _plan(root, piece, bind_weight=2, strict=False)

    def text_of(node: _P, holes: dict[int, Any], top: bool) -> str:
        if not top and id(node) in holes:
            _, value = holes[id(node)]
            return str(value)
        ref: syntax.Node = node.ref
        out = []
        at = ref.start
        for kid in node.kids:
            out.append(source[at : kid.ref.start])
            out.append(text_of(kid, holes, False))
            at = kid.ref.end
        out.append(source[at : ref.end])
        return "".join(out)

    composer = _Composer(
        name=lambda: f"{prefix}{next(counter)}",
        piece=lambda node, holes: text_of(node, holes, True),
        bind=lambda name, value, body: f"cel.bind({name}, {value}, {body})",
    )
    text = composer.compose(root)
    return Hoisted(source[: parsed.root.start] + text + source[parsed.root.end :], prefix)


_LOCATION: Final = re.compile(r"<input>:(\d+):(\d+): ")


def drop_locations(message: str) -> str:
    """A compile error about the rewritten source, without the positions and source lines
    that would point into the rewriting rather than into the expression as written."""
    lines = [line for line in message.splitlines() if not line.startswith(" | ")]
    return _LOCATION.sub("", "\n".join(lines))


# --------------------------------------------------------------------------- checked level


def inline(checked_expr: Any, prefix: str) -> None:
    """Undo :func:`hoist_source` in a checked expression: each bound value back where its name
    is read, each bind replaced by its body."""
    _resolve(checked_expr.expr, {}, prefix)


def _resolve(node: Any, values: dict[str, Any], prefix: str) -> None:
    kind = node.WhichOneof("expr_kind")
    if kind == "comprehension_expr" and node.comprehension_expr.accu_var.startswith(prefix):
        c = node.comprehension_expr
        _resolve(c.accu_init, values, prefix)
        inner = {**values, c.accu_var: copy.deepcopy(c.accu_init)}
        body = copy.deepcopy(c.result)
        _resolve(body, inner, prefix)
        node.CopyFrom(body)
        return
    if kind == "ident_expr" and node.ident_expr.name in values:
        node.CopyFrom(values[node.ident_expr.name])
        return
    for child in checked.children(node):
        _resolve(child, values, prefix)


def _message_height(root: Any) -> int:
    """How deeply *root*'s protobuf messages nest (an expression node and its kind's message
    count two levels, a map or message entry one more)."""
    deepest = 0
    stack = [(root, 0)]
    while stack:
        node, above = stack.pop()
        kind = node.WhichOneof("expr_kind")
        here = above + (3 if kind == "struct_expr" else 2)
        deepest = max(deepest, here)
        stack.extend((kid, here) for kid in checked.children(node))
    return deepest


def _checked_tree(node: Any) -> _P:
    kind = node.WhichOneof("expr_kind")
    p = _P(node, weight=3 if kind == "struct_expr" else 2)
    free: set[str] = set()
    if kind == "comprehension_expr":
        c = node.comprehension_expr
        loop_names = frozenset(n for n in (c.iter_var, c.iter_var2, c.accu_var) if n)
        parts = [
            (c.iter_range, frozenset()),
            (c.accu_init, frozenset()),
            (c.loop_condition, loop_names),
            (c.loop_step, loop_names),
            (c.result, frozenset({c.accu_var})),
        ]
        for i, (part, names) in enumerate(parts):
            kid = _checked_tree(part)
            if i >= 2:  # the parts evaluated in each iteration, or in the variables' scope
                kid.region = True
                kid.binds = names
                kid.cuttable = False
            free |= kid.free - names
            p.kids.append(kid)
    else:
        for part in checked.children(node):
            kid = _checked_tree(part)
            free |= kid.free
            p.kids.append(kid)
    if kind == "ident_expr":
        free.add(node.ident_expr.name)
    p.free = frozenset(free)
    if kind in ("ident_expr", "const_expr", None):
        p.cuttable = False
    return p


def shallow(checked_expr: Any, *, strict: bool = False) -> Any:
    """*checked_expr* itself when cel-expr-python can load it, else a copy hoisted until it
    can (see the module doc); *strict* for an expression that charges its cost as it runs
    (its per-iteration parts keep their binds inside)."""
    if _message_height(checked_expr.expr) <= MESSAGE_DEPTH_LIMIT:
        return checked_expr
    factory = checked.NodeFactory(checked_expr)
    counter = iter(range(1 << 30))
    attempt = checked_expr
    for piece in (64, 48, 32, 24, 16):
        attempt = copy.deepcopy(checked_expr)
        root = _checked_tree(attempt.expr)
        _plan(root, piece, bind_weight=2, strict=strict)
        composer = _Composer(
            name=lambda: f"@deep{next(counter)}",
            piece=_filler(factory, attempt.type_map),
            bind=factory.bind,
        )
        attempt.expr.CopyFrom(composer.compose(root))
        if _message_height(attempt.expr) <= MESSAGE_DEPTH_LIMIT:
            return attempt
    return attempt  # cel-expr-python will say it cannot load it


def _filler(
    factory: checked.NodeFactory, types: Any
) -> Callable[[_P, dict[int, tuple[str, Any]]], Any]:
    """The AST emitter's piece: the node with its holes filled in place (a name, typed as
    the part it stands for, or a region's bound form), copied out."""

    def piece_of(node: _P, holes: dict[int, tuple[str, Any]]) -> Any:
        stack = list(node.kids)
        while stack:
            kid = stack.pop()
            if id(kid) not in holes:
                stack.extend(kid.kids)
                continue
            kind, value = holes[id(kid)]
            if kind == "name":
                replacement = factory.ident(value)
                if kid.ref.id in types:
                    types[replacement.id].CopyFrom(types[kid.ref.id])
                value = replacement
            kid.ref.CopyFrom(value)
        return copy.deepcopy(node.ref)

    return piece_of
