"""CEL evaluation benchmark: the typical selector (cached device input, as the allocator runs
it) and the bombs of the hardening and fidelity issues, with their outcome, time and the
process's peak memory. Prints a table; ``python -m bench.cel`` (``make bench-cel``)."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from driver.api.errors import CELCompileError, CELEvaluationError
from driver.api.model import Capacity, Device, Version
from driver.api.quantity import Quantity
from driver.cel import engine

DRIVER = "gpu.biaxial.dev"
D = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

DEVICE = Device(
    name="gpu-0",
    attributes={
        "type": "gpu",
        "productName": "NVIDIA A100-SXM4-80GB",
        "architecture": "Ampere",
        "index": 0,
        "driverVersion": Version("550.54.15"),
    },
    capacity={
        "memory": Capacity(Quantity.parse("80Gi")),
        "cores": Capacity(Quantity.from_int(100)),
    },
    allow_multiple_allocations=True,
)

TYPICAL = (
    f'device.driver == "{DRIVER}" && {D}.productName.startsWith("NVIDIA A100") && '
    f'{C}.memory.compareTo(quantity("40Gi")) >= 0'
)
# A selector comparing a dyn attribute with ==: it runs through the check that one of
# Kubernetes' types on the left errs against another type (driver.cel.engine).
ATTRIBUTE_EQUALITY = f'{D}.productName == "NVIDIA A100-SXM4-80GB" && {D}.index == 0'
TEN = "[" + ",".join(str(i) for i in range(10)) + "]"


def growth_bomb(levels: int) -> str:
    """cel.bind / map / join: each level makes the string ten times longer (issue 15)."""
    body = f"v{levels}[0].size() > 0"
    for level in range(levels, 0, -1):
        body = (
            f"cel.bind(v{level}, v{level - 1}.map(s, [s, s, s, s, s, s, s, s, s, s].join('')), "
            f"{body})"
        )
    return f"cel.bind(v0, ['{'x' * 64}'], {body})"


BOMBS: dict[str, str] = {
    "growth bomb (bind/map/join, 8 levels)": growth_bomb(8),
    "string doubling (bind, 28 levels)": "cel.bind(s0, 'xxxxxxxxxxxxxxxx', "
    + "".join(f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, 29))
    + "s28.size() > 0"
    + ")" * 29,
    "nested comprehension, 4 x 10 (11,110 iterations)": (
        f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, true))))"
    ),
    "range bomb (lists.range(10^9))": "lists.range(1000000000).size() > 0",
    "nesting, 200 levels (compile and run)": "(" * 200 + "true" + ")" * 200,
    "regex backtracking: find((a+)+$), no match": '"' + "a" * 28 + '!".find("(a+)+$") == ""',
    "regex backtracking: findAll((a+)+b), matches late": (
        '"' + "a" * 5000 + '!ab".findAll("(a+)+b").size() == 1'
    ),
}


def _time(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    prepared = engine.device_input(DEVICE, DRIVER)
    print(f"{'case':<52} {'outcome':<44} {'time':>10} {'peak RSS':>10}")
    for name, expression in (
        ("typical selector (cached input)", TYPICAL),
        ("attribute == string (cached input)", ATTRIBUTE_EQUALITY),
    ):
        selector = engine.compile_selector(expression)
        result = selector.evaluate(prepared, DEVICE.name)
        per_eval = min(
            _time(lambda s=selector: s.evaluate(prepared, DEVICE.name), 20_000) for _ in range(5)
        )
        print(f"{name:<52} {str(result).lower():<44} {per_eval * 1e6:>8.1f}µs {_rss():>8}MB")
    for name, expression in BOMBS.items():
        start = time.perf_counter()
        try:
            bomb = engine.compile_selector(expression)
            outcome = f"{bomb.matches(DEVICE, DRIVER)} (estimate {bomb.max_cost:.3g})"
        except (CELEvaluationError, CELCompileError) as exc:
            outcome = str(exc).rsplit(": ", 1)[-1][:44]
        elapsed = time.perf_counter() - start
        print(f"{name:<52} {outcome:<44} {elapsed * 1e3:>8.1f}ms {_rss():>8}MB")


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


if __name__ == "__main__":
    main()
