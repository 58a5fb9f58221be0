"""The one CEL environment: upstream's extensions and standard library (with its comparisons
and ``string`` redeclared), the ``device`` variables, the library's declarations and runtime
functions, and the engine's own helpers (the cost meter's ticks and charges, driven loops, the
"no such overload" of Kubernetes' types)."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Final

from cel_expr_python import cel

from driver.cel import (
    cost,
    drive,
    instrument,
    library,
)
from driver.cel.bindings import COMPARISONS, LIBRARY, standard_redeclarations
from driver.cel.dispatch import DISPATCH_DECLS, MESSAGE_KIND, kind_type, position_kinds
from driver.cel.loops import current_accumulator, observe_condition, run_loop
from driver.cel.rewrites import NO_SUCH_OVERLOAD_FUNCTION
from driver.cel.values import POOL, QUANTITY_TYPE_NAME


def _functions() -> list[Any]:
    by_name: dict[str, list[Any]] = {}
    runtime = []
    for o in LIBRARY:
        if o.function != "string" and not o.function.startswith("cel.@"):
            # (``string`` is redeclared whole below; cel.@mapInsert is declared by cel-cpp)
            by_name.setdefault(o.function, []).append(
                cel.Overload(o.overload_id, o.result, list(o.params), is_member=o.member)
            )
        # The runtime matches arguments by kind and a dyn parameter matches none: one
        # implementation per kind there.
        kinds = [position_kinds("DYN") if p.name() == "DYN" else [p.name()] for p in o.params]
        runtime.append(
            cel.FunctionDecl(
                o.runtime_name,
                [
                    cel.Overload(
                        f"{o.runtime_name}#{'/'.join(combo)}",
                        o.result,
                        [
                            p if p.name() != "DYN" else kind_type(k)
                            for p, k in zip(o.params, combo, strict=True)
                        ],
                        is_member=o.member,
                        impl=o.impl,
                    )
                    for combo in itertools.product(*kinds)
                ],
            )
        )
    t = cel.Type
    meter = [
        cel.FunctionDecl(
            instrument.TICK_FUNCTION,
            [cel.Overload(instrument.TICK_FUNCTION, t.BOOL, [t.INT], impl=_tick)],
        ),
        cel.FunctionDecl(
            drive.LOOP_FUNCTION,
            [cel.Overload(drive.LOOP_FUNCTION, t.DYN, [t.INT, t.List(t.DYN)], impl=run_loop)],
        ),
        cel.FunctionDecl(
            drive.ACCUMULATOR_FUNCTION,
            [cel.Overload(drive.ACCUMULATOR_FUNCTION, t.DYN, [], impl=current_accumulator)],
        ),
        cel.FunctionDecl(
            drive.OBSERVE_FUNCTION,
            [cel.Overload(drive.OBSERVE_FUNCTION, t.BOOL, [t.BOOL], impl=observe_condition)],
        ),
        cel.FunctionDecl(
            NO_SUCH_OVERLOAD_FUNCTION,
            [
                cel.Overload(
                    f"{NO_SUCH_OVERLOAD_FUNCTION}#{kind}",
                    t.BOOL,
                    [kind_type(MESSAGE_KIND), kind_type(kind)],
                    impl=no_such_overload,
                )
                for kind in position_kinds("DYN")
            ],
        ),
        cel.FunctionDecl(
            instrument.CHARGE_FUNCTION,
            [
                cel.Overload(
                    instrument.CHARGE_FUNCTION, t.BOOL, [t.INT, t.List(t.DYN)], impl=_charge
                )
            ],
        ),
    ]
    declared = [cel.FunctionDecl(name, overloads) for name, overloads in by_name.items()]
    return declared + runtime + DISPATCH_DECLS + meter + standard_redeclarations(LIBRARY)


def _tick(amount: int) -> bool:
    """The fixed cost of a region of a metered evaluation (driver.cel.instrument)."""
    cost.charge(amount)
    return True


def _charge(rule: int, operands: list[Any]) -> bool:
    """A size-dependent function of the engine's own, in a metered evaluation."""
    amount, work = instrument.charge_amount(rule, operands)
    cost.charge(amount)
    if work:
        cost.charge_work(work)
    return True


_ENV_CONFIG: Final = """
extensions:
  - name: "bindings"
  - name: "optional"
  - name: "lists"
    version: 2
  - name: "sets"
  - name: "two-var-comprehensions"
stdlib:
  exclude_functions:
""" + "".join(f'    - name: "{name}"\n' for name in (*COMPARISONS, "string"))

_ENV_LOCK = threading.Lock()
_ENV: Any = None


def cel_env() -> Any:
    """The one CEL environment, built on first use (thread-safe)."""
    global _ENV  # noqa: PLW0603 - a lazily built process-wide singleton
    with _ENV_LOCK:
        if _ENV is None:
            t = cel.Type
            _ENV = cel.NewEnv(
                POOL,
                config=cel.NewEnvConfigFromYaml(_ENV_CONFIG),
                variables={
                    "device.driver": t.STRING,
                    "device.attributes": t.Map(t.STRING, t.Map(t.STRING, t.DYN)),
                    "device.capacity": t.Map(t.STRING, t.Map(t.STRING, t(QUANTITY_TYPE_NAME))),
                    "device.allowMultipleAllocations": t.BOOL,
                },
                functions=_functions(),
            )
        return _ENV


def no_such_overload(*_: Any) -> Any:
    raise library.CELFunctionError("no such overload")
