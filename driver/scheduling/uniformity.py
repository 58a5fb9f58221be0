"""Class uniformity: which DeviceClasses select every node-local device of every node alike.

The pruned walk's bounds are exact for simple pods only when the GPU axis's choice is known
from the capacity index, which needs the pod's classes to select every node-local device and
nothing else (taints, shared counters) to set one apart. :class:`ClassUniformity` answers that
per class with one CEL sweep over the devices and caches the answer until the engine is
rebuilt (classes, slices and nodes are fixed between rebuilds; allocations do not matter).

The sweep evaluates a selector once per group of devices that look the same to it:
:func:`referenced_names` says conservatively which names an expression can read, and devices
that agree on every attribute and capacity under those names give the same verdict. Results
land in the snapshot's CEL match cache, which the allocator reads later. Never mutates its
inputs; a CEL error makes a class non-uniform (the allocator then reports it for the pod).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from driver.api.errors import BiaxialError
from driver.cel.engine import compile_selector
from driver.scheduling.capacity_index import CapacityIndex
from driver.structured.snapshot import Candidate, ClusterSnapshot

_DYNAMIC_ACCESS: Final = re.compile(
    r"\b(?:all|exists|exists_one|map|filter|size|has)\s*\(|\bin\b|[?\\@{]"
)
_LITERAL_INDEX: Final = re.compile(r"\[\s*(\"[^\"\\]*\"|'[^'\\]*')\s*\]")
_TOKEN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def referenced_names(expression: str) -> frozenset[str] | None:
    """Every name a CEL selector can read from a device, or None when it may read names it
    does not spell out (comprehensions, ``size``, ``has``, ``in``, computed or optional
    indexes, escapes). Conservative: a word anywhere in the text, string literals included,
    counts as referenced."""
    if _DYNAMIC_ACCESS.search(expression):
        return None
    if "[" in _LITERAL_INDEX.sub(" ", expression):
        return None
    words = set(_TOKEN.findall(expression))
    for literal in _LITERAL_INDEX.findall(expression):
        words.update(literal.strip("\"'").split("/"))
    return frozenset(words)


def visible_keys(names: frozenset[str]) -> frozenset[str]:
    """The attribute / capacity keys a selector reading only ``names`` can reach: a name in
    the driver's domain (unqualified key) or in a domain it spells out (``domain/name``)."""
    domains = [n for n in names if "." in n]
    return names | {f"{d}/{n}" for d in domains for n in names}


class VisibleDevice(NamedTuple):
    """What a selector that reads only some keys sees of a device."""

    driver: str
    shareable: bool
    attributes: tuple[tuple[str, object], ...]
    capacity: tuple[tuple[str, int], ...]


def visible(candidate: Candidate, keys: frozenset[str]) -> VisibleDevice:
    device = candidate.device
    attributes = device.attributes
    capacity = device.capacity
    return VisibleDevice(
        candidate.device_id.driver,
        device.allow_multiple_allocations,
        tuple((k, attributes[k]) for k in sorted(attributes.keys() & keys)),
        tuple((k, capacity[k].value.nanos) for k in sorted(capacity.keys() & keys)),
    )


class ClassUniformity:
    """Per-class uniformity over the nodes of one index (see the module docstring)."""

    def __init__(self, snapshot: ClusterSnapshot, index: CapacityIndex) -> None:
        self._snapshot = snapshot
        self._index = index
        self._known: dict[str, bool] = {}

    def uniform(self, classes: frozenset[str]) -> bool:
        """Whether every node-local device of every indexed node passes these classes'
        selectors and nothing else (taints, counters) can set one apart; cached per class."""
        uniform = True
        for name in sorted(classes):
            known = self._known.get(name)
            if known is None:
                known = self._class_is_uniform(name)
                self._known[name] = known
            uniform = uniform and known
        return uniform

    def _class_is_uniform(self, name: str) -> bool:
        snapshot = self._snapshot
        device_class = snapshot.classes.get(name)
        cache = snapshot.match_cache
        if device_class is None or cache is None:
            return False
        try:
            selectors = [compile_selector(e) for e in device_class.selectors]
            names = [referenced_names(s.expression) for s in selectors]
            keys = [visible_keys(n) if n is not None else None for n in names]
            seen: list[set[VisibleDevice]] = [set() for _ in selectors]
            for state in self._index.states.values():
                for cand in snapshot.candidates(state.node).devices:
                    if not cand.node_local or not cand.node_match:
                        continue
                    if cand.blocking_taints or cand.consumes:
                        return False
                    for selector, referenced, done in zip(selectors, keys, seen, strict=True):
                        if referenced is None:
                            ok = cache.matches(
                                selector, cand.device_id, cand.match_generation, cand.device
                            )
                        else:
                            # Devices that agree on everything the expression can read give
                            # the same answer: evaluate one of them.
                            looks = visible(cand, referenced)
                            if looks in done:
                                continue
                            ok = selector.matches(cand.device, cand.device_id.driver)
                            done.add(looks)
                        if not ok:
                            return False
        except BiaxialError:
            return False
        return True
