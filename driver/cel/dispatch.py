"""Runtime names and dyn dispatch for the library overloads.

The runtime keeps one implementation per name and argument kinds, so every overload of a
library function runs under a private name (``@`` + its overload id) with its own
implementation and return type; the checked expression's calls are renamed to it
(:func:`runtime_name`). Where the checker cannot pick one overload (a dyn attribute value as
receiver: a version's ``compareTo``, a list attribute's ``sum``), the call runs under a
dispatcher that picks the overload from the values at run time, as cel-go's runtime does."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any, Final

from cel_expr_python import cel

from driver.cel import (
    library,
)
from driver.cel.bindings import LIBRARY, Overload
from driver.cel.values import MESSAGE_CLASSES, QUANTITY_TYPE_NAME, value_type_name

# --------------------------------------------------------------------------- dyn dispatch
#
# Where the checker cannot pick one overload (a dyn attribute value as receiver: a version's
# ``compareTo``, a list attribute's ``sum``), the call runs under a dispatcher that picks the
# overload from the values at run time, as cel-go's runtime does.


def _accepts(type_name: str, value: Any) -> bool:
    if type_name == "DYN":
        return True
    if type_name in ("INT", "UINT"):
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "DOUBLE":
        return isinstance(value, float)
    if type_name == "BOOL":
        return isinstance(value, bool)
    if type_name == "STRING":
        return isinstance(value, str)
    if type_name == "BYTES":
        return isinstance(value, bytes | bytearray)
    if type_name == "DURATION":
        return isinstance(value, dt.timedelta)
    if type_name == "TIMESTAMP":
        return isinstance(value, dt.datetime)
    if type_name == "NULL":
        return value is None
    if type_name.startswith("LIST<"):
        inner = type_name[5:-1]
        return isinstance(value, list) and all(_accepts(inner, v) for v in value)
    if type_name.startswith("MAP<"):
        return isinstance(value, dict)
    cls = MESSAGE_CLASSES.get(type_name)
    return cls is not None and isinstance(value, cls)


_DISPATCH_KINDS: Final = (
    "INT", "UINT", "DOUBLE", "BOOL", "STRING", "BYTES", "LIST<DYN>", "MAP<DYN, DYN>",
    "DURATION", "TIMESTAMP", "NULL", *MESSAGE_CLASSES,
)  # fmt: skip


def kind_type(name: str) -> Any:
    t = cel.Type
    simple = {
        "INT": t.INT, "UINT": t.UINT, "DOUBLE": t.DOUBLE, "BOOL": t.BOOL, "STRING": t.STRING,
        "BYTES": t.BYTES, "LIST<DYN>": t.List(t.DYN), "MAP<DYN, DYN>": t.Map(t.DYN, t.DYN),
        "DURATION": t.DURATION, "TIMESTAMP": t.TIMESTAMP, "NULL": t.NULL,
    }  # fmt: skip
    return simple.get(name) or t(name)


MESSAGE_KIND: Final = QUANTITY_TYPE_NAME  # the runtime has one kind for every message type


def position_kinds(type_name: str) -> list[str]:
    if type_name == "DYN":
        return [k for k in _DISPATCH_KINDS if k not in MESSAGE_CLASSES] + [MESSAGE_KIND]
    if type_name in MESSAGE_CLASSES:
        return [MESSAGE_KIND]
    if type_name.startswith("LIST<"):
        return ["LIST<DYN>"]
    if type_name.startswith("MAP<"):
        return ["MAP<DYN, DYN>"]
    return [type_name]


def _dispatcher(candidates: list[Overload]) -> Callable[..., Any]:
    names = [[p.name() for p in o.params] for o in candidates]

    def dispatch(*args: Any) -> Any:
        for overload, params in zip(candidates, names, strict=True):
            if all(_accepts(p, a) for p, a in zip(params, args, strict=True)):
                return overload.impl(*args)
        kinds = ", ".join(value_type_name(a) for a in args)
        raise library.CELFunctionError(f"no such overload: {candidates[0].function}({kinds})")

    return dispatch


def _dispatchers() -> tuple[dict[tuple[str, int, bool], str], list[Any]]:
    groups: dict[tuple[str, int, bool], list[Overload]] = {}
    for o in LIBRARY:
        groups.setdefault((o.function, len(o.params), o.member), []).append(o)
    names: dict[tuple[str, int, bool], str] = {}
    decls = []
    for key, candidates in groups.items():
        if len(candidates) < 2:
            continue
        name = f"@dyn.{key[0]}.{key[1]}"
        names[key] = name
        impl = _dispatcher(candidates)
        per_position: list[set[str]] = [set() for _ in range(key[1])]
        for o in candidates:
            for i, p in enumerate(o.params):
                per_position[i].update(position_kinds(p.name()))
        overloads = [
            cel.Overload(
                f"{name}#{'/'.join(combo)}",
                cel.Type.DYN,
                [kind_type(k) for k in combo],
                is_member=key[2],
                impl=impl,
            )
            for combo in itertools.product(*(sorted(k) for k in per_position))
        ]
        decls.append(cel.FunctionDecl(name, overloads))
    return names, decls


_DISPATCH_NAMES, DISPATCH_DECLS = _dispatchers()
OVERLOADS: Final = {o.overload_id: o for o in LIBRARY}


def runtime_name(function: str, overload_ids: list[str], arity: int, member: bool) -> str | None:
    """The private name a library call runs under, or None for the engine's own functions."""
    if not overload_ids or any(i not in OVERLOADS for i in overload_ids):
        return None
    if len(overload_ids) == 1:
        return OVERLOADS[overload_ids[0]].runtime_name
    return _DISPATCH_NAMES.get((function, arity, member))
