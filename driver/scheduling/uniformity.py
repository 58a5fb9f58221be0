"""Class uniformity: which DeviceClasses select every node-local device of every node alike.

The pruned walk's bounds are exact for simple pods only when the GPU axis's choice is known
from the capacity index, which needs the pod's classes to select every node-local device and
nothing else (taints, shared counters) to set one apart. :class:`ClassUniformity` answers that
per class with one CEL sweep over the devices and caches the answer until the engine is
rebuilt (classes, slices and nodes are fixed between rebuilds; allocations do not matter).

The sweep evaluates a selector once per group of devices that look the same to it:
:func:`driver.cel.reads.referenced_names` says conservatively which names an expression can
read, and devices that agree on every attribute and capacity under those names give the same
verdict. Results land in the snapshot's CEL match cache, which the allocator reads later. Never
mutates its inputs; a CEL error makes a class non-uniform (the allocator then reports it for
the pod).
"""

from __future__ import annotations

from driver.api.errors import BiaxialError
from driver.cel.engine import compile_selector
from driver.cel.reads import readable_keys, visible
from driver.scheduling.capacity_index import CapacityIndex
from driver.structured.snapshot import ClusterSnapshot


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
            keys = [readable_keys(s.expression) for s in selectors]
            seen: list[set[tuple[object, ...]]] = [set() for _ in selectors]
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
                            looks = visible(cand.device, cand.device_id.driver, referenced)
                            if looks in done:
                                continue
                            ok = selector.matches(cand.device, cand.device_id.driver)
                            done.add(looks)
                        if not ok:
                            return False
        except BiaxialError:
            return False
        return True
