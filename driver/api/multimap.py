"""A key -> values index whose values are kept as a tuple per key.

The controller and the engine index tens of thousands of held claims by the pods that reserve
them, and nearly every key has one value: a one-value tuple costs 48 bytes, a set 216 (at
35,000 held claims the sets and frozensets of those indexes took 24 MB, tuples take 7).
Adding and discarding scan the key's values, which suits the few values a key has here (the
claims of one pod). Keys left with no value are dropped.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V", bound=Hashable)


class Multimap(Generic[_K, _V]):
    """``key -> values`` (each value once per key, in the order added)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[_K, tuple[_V, ...]] = {}

    def get(self, key: _K) -> tuple[_V, ...]:
        return self._values.get(key, ())

    def add(self, key: _K, value: _V) -> None:
        values = self._values.get(key, ())
        if value not in values:
            self._values[key] = (*values, value)

    def discard(self, key: _K, value: _V) -> None:
        values = self._values.get(key, ())
        if value in values:
            rest = tuple(v for v in values if v != value)
            if rest:
                self._values[key] = rest
            else:
                del self._values[key]

    def pop(self, key: _K) -> tuple[_V, ...]:
        """The values of ``key``, which is dropped."""
        return self._values.pop(key, ())

    def __len__(self) -> int:
        return len(self._values)
