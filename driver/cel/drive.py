"""Comprehensions driven from Python, in chunks: the way around cel-cpp's iteration budget.

cel-cpp stops one evaluation after 10,000 comprehension iterations in total ("Iteration
budget exceeded"), and cel-expr-python offers no option to raise it; upstream bounds only the
cost, so four nested comprehensions over ten elements (11,110 iterations, actual cost 114,441)
are ``true`` there. :func:`drive` rewrites a checked expression so that every comprehension
(``cel.bind`` aside, which never iterates) becomes a call ``@biaxial.loop(k, [range, init,
free variables...])``; the engine's implementation of that call evaluates comprehension *k*
over its range in chunks of at most :data:`CHUNK` elements, each chunk one evaluation of a
small program (:class:`Loop`) with its own budget, carrying the accumulator from chunk to chunk,
and stops where the loop condition turns false, as the comprehension would. Nested
comprehensions are loops of their own, so no evaluation ever runs more than :data:`CHUNK`
iterations, and the actual-cost meter (an instrumented expression, ``driver.cel.instrument``)
counts exactly what the comprehension would have.

A two-variable comprehension over a list sees the element's index as its first variable: a
chunk adds its offset (``@offset``) to the index the chunk's own comprehension counts. Pure
module: the engine compiles the programs and implements the functions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Final

from driver.cel import checked, estimate

CHUNK: Final = 5_000  # iterations per evaluation, below cel-cpp's budget of 10,000
LOOP_FUNCTION: Final = "@biaxial.loop"  # (int k, list operands) -> dyn
ACCUMULATOR_FUNCTION: Final = "@biaxial.accu"  # () -> dyn: the accumulator carried in
OBSERVE_FUNCTION: Final = "@biaxial.observe"  # (bool) -> bool: records the loop condition
RANGE_NAME: Final = "@range"
OFFSET_NAME: Final = "@offset"
INDEX_NAME: Final = "@index"

_DEVICE_FIELDS: Final = frozenset(
    {"device.driver", "device.attributes", "device.capacity", "device.allowMultipleAllocations"}
)


@dataclass(frozen=True, slots=True)
class Loop:
    """One driven comprehension: the program for one chunk of its range, the program of its
    result (None when the result is the accumulator itself), and the names of the outer
    variables both read (passed in after the range and the accumulator's start). Both read
    the accumulator from ``@biaxial.accu()``."""

    chunk: Any  # checked expression: the comprehension over @range, result = accumulator
    result: Any | None  # checked expression: the comprehension's result
    free: tuple[str, ...]
    indexed: bool  # a two-variable comprehension whose first variable is a list index


@dataclass(frozen=True, slots=True)
class Driven:
    main: Any
    loops: tuple[Loop, ...]


def drive(checked_expr: Any) -> Driven:
    """The expression with every comprehension replaced by a driven loop."""
    main = copy.deepcopy(checked_expr)
    builder = _Builder(main)
    builder.rewrite(main.expr, frozenset())
    return Driven(main, tuple(builder.loops))


class _Builder:
    def __init__(self, checked_expr: Any) -> None:
        self.ce = checked_expr
        self.loops: list[Loop] = []
        self.new = checked.NodeFactory(checked_expr)

    def rewrite(self, node: Any, bound: frozenset[str]) -> None:
        """Replace every comprehension under *node* (innermost first); *bound* are the names
        the enclosing scopes bind."""
        if node.WhichOneof("expr_kind") != "comprehension_expr":
            for child in checked.children(node):
                self.rewrite(child, bound)
            return
        c = node.comprehension_expr
        self.rewrite(c.iter_range, bound)
        self.rewrite(c.accu_init, bound)
        inner = bound | {c.iter_var, c.accu_var} | ({c.iter_var2} if c.iter_var2 else set())
        self.rewrite(c.loop_condition, inner)
        self.rewrite(c.loop_step, inner)
        self.rewrite(c.result, bound | {c.accu_var})
        if not estimate.is_bind(c):
            self.replace(node, bound)

    def replace(self, node: Any, bound: frozenset[str]) -> None:
        c = node.comprehension_expr
        own = {c.iter_var, c.accu_var} | ({c.iter_var2} if c.iter_var2 else set())
        read = _names(c.loop_condition) | _names(c.loop_step) | _names(c.result)
        free = tuple(sorted((read & bound) - own))
        indexed = bool(c.iter_var2) and (
            estimate.type_info(self.ce.type_map.get(c.iter_range.id)).kind == "list"
        )
        result = None
        if not (
            c.result.WhichOneof("expr_kind") == "ident_expr"
            and c.result.ident_expr.name == c.accu_var
        ):
            accumulator = self.new.call(ACCUMULATOR_FUNCTION, [])
            result = self.program(self.new.bind(c.accu_var, accumulator, copy.deepcopy(c.result)))
        k = len(self.loops)
        self.loops.append(Loop(self.program(self.chunk(c, indexed)), result, free, indexed))
        operands = [copy.deepcopy(c.iter_range), copy.deepcopy(c.accu_init)]
        operands += [self.new.ident(name) for name in free]
        node.CopyFrom(
            self.new.call(LOOP_FUNCTION, [self.new.int_node(k), self.new.list_node(operands)])
        )

    def program(self, expr: Any) -> Any:
        """A checked expression of its own, with the whole expression's type and reference
        maps."""
        out = copy.deepcopy(self.ce)
        out.expr.CopyFrom(expr)
        return out

    def chunk(self, c: Any, indexed: bool) -> Any:
        """The comprehension over @range from @biaxial.accu(), its condition observed, its
        result the accumulator; an indexed first variable reads @index + @offset."""
        e = self.new.node()
        out = e.comprehension_expr
        out.iter_var = INDEX_NAME if indexed else c.iter_var
        if c.iter_var2:
            out.iter_var2 = c.iter_var2
        out.accu_var = c.accu_var
        out.iter_range.CopyFrom(self.new.ident(RANGE_NAME))
        out.accu_init.CopyFrom(self.new.call(ACCUMULATOR_FUNCTION, []))
        condition = self.indexed(c.loop_condition, c.iter_var if indexed else "")
        out.loop_condition.CopyFrom(self.new.call(OBSERVE_FUNCTION, [condition]))
        out.loop_step.CopyFrom(self.indexed(c.loop_step, c.iter_var if indexed else ""))
        out.result.CopyFrom(self.new.ident(c.accu_var))
        return e

    def indexed(self, node: Any, name: str) -> Any:
        """A copy of *node* where the variable *name* reads @index + @offset."""
        out = copy.deepcopy(node)
        if not name:
            return out
        for n in checked.walk(out):
            if n.WhichOneof("expr_kind") == "ident_expr" and n.ident_expr.name == name:
                index = [self.new.ident(INDEX_NAME), self.new.ident(OFFSET_NAME)]
                n.CopyFrom(self.new.call("_+_", index))
        return out


def _names(node: Any) -> set[str]:
    """The identifiers *node* reads, the device's variables aside."""
    return {
        n.ident_expr.name
        for n in checked.walk(node)
        if n.WhichOneof("expr_kind") == "ident_expr" and n.ident_expr.name not in _DEVICE_FIELDS
    }
