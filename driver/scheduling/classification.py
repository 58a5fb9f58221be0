"""Device classification: which DeviceClasses select each device, and what a request selector
answers for a whole kind of device — the exact facts the node search's bounds are built on.

The pruned node search bounds what a pod can add to a node from the devices the pod could use
there. A device serves a request only if the request's class selects it, so the capacity index
files devices by *kind*, and a kind includes the set of classes that select its devices
(:meth:`DeviceClassifier.classes_of`). Two GPU models with equal capacities but a different
attribute some class reads are different kinds; a MIG partition never counts towards a whole-GPU
class; one special GPU forms a kind of its own instead of switching anything off cluster-wide.

**Class membership is exact per device.** Each class's selectors are evaluated once per group
of devices that look the same to them: :func:`driver.cel.reads.referenced_names` says,
conservatively, which names an expression can read, and devices that agree on every attribute
and capacity under those names (plus driver and ``allowMultipleAllocations``) give the same
verdict. An expression whose reads cannot be bounded that way is evaluated per device. A CEL
error counts as "selects" (the allocator evaluates the device itself and reports the error for
the pod), so a bound never leaves out a device the allocator might pick. The verdicts are
handed to the allocator (:meth:`DeviceClassifier.seed`): it never evaluates a class selector
the sweep has answered, and keeps no CEL input for those devices.

**Request selectors** are per pod. :meth:`DeviceClassifier.verdict` answers for a whole kind:
True or False when every device of the kind agrees on everything the expression can read (the
kind's varying attribute keys are disjoint from its referenced names), None when it cannot
tell. None is always safe: the kind then counts as usable.

Verdicts are cached by expression and content, so they survive index rebuilds. Never mutates
its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Final, NamedTuple

from driver.api.claims import DeviceClass
from driver.api.errors import BiaxialError
from driver.api.model import Device
from driver.cel.engine import Selector, compile_selector
from driver.cel.reads import referenced_names, visible_keys
from driver.structured.snapshot import Candidate, NodeCandidates

_MISSING: Final = object()


def _NOTHING(_: object) -> tuple[()]:  # noqa: N802 - stands in for an itemgetter of no keys
    return ()


def _tuple_getter(keys: tuple[str, ...]) -> Callable[[Mapping[str, object]], tuple[object, ...]]:
    """Reads ``keys``' values from a mapping as a tuple, whatever their number (an
    ``itemgetter`` of one key gives the value itself); a missing key raises KeyError."""
    if not keys:
        return _NOTHING
    if len(keys) == 1:
        (key,) = keys
        return lambda mapping: (mapping[key],)
    return itemgetter(*keys)


#: Distinct node layouts whose seeded verdict lists are kept (:meth:`DeviceClassifier.seed`).
_SEED_LAYOUTS: Final = 4096


class _Reads(NamedTuple):
    """What one selector can read of a device: attribute and capacity keys. An expression that
    never names ``attributes`` (``capacity``) reads no attribute (capacity): the device's maps
    are reachable only as ``device.attributes`` / ``device.capacity``."""

    attributes: frozenset[str]
    capacity: frozenset[str]


def _reads(expression: str) -> _Reads | None:
    """None: the expression may read anything, so only the device itself tells."""
    names = referenced_names(expression)
    if names is None:
        return None
    keys = visible_keys(names)
    return _Reads(
        keys if "attributes" in names else frozenset(),
        keys if "capacity" in names else frozenset(),
    )


_SORTED_KEYS: dict[_Reads, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _sorted_keys(reads: _Reads) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The attribute and capacity keys of ``reads`` in order, sorted once per key set (a
    device's looks list what it has of them in this order, as sorting its pairs would)."""
    found = _SORTED_KEYS.get(reads)
    if found is None:
        found = _SORTED_KEYS[reads] = (
            tuple(sorted(reads.attributes)),
            tuple(sorted(reads.capacity)),
        )
    return found


def _seen_as(device: Device, driver: str, reads: _Reads) -> tuple[object, ...]:
    """What a selector with ``reads`` sees of ``device`` (it may not be hashable)."""
    attributes = device.attributes
    capacity = device.capacity
    attribute_keys, capacity_keys = _sorted_keys(reads)
    return (
        driver,
        device.allow_multiple_allocations,
        tuple([(k, attributes[k]) for k in attribute_keys if k in attributes]),
        tuple([(k, capacity[k].value.nanos) for k in capacity_keys if k in capacity]),
    )


def _looks(device: Device, driver: str, reads: _Reads) -> tuple[object, ...] | None:
    """What a selector with ``reads`` sees of ``device`` (None: not hashable, so ask the
    device)."""
    looks = _seen_as(device, driver, reads)
    try:
        hash(looks)
    except TypeError:
        return None
    return looks


@dataclass(slots=True)
class _ClassRule:
    """One DeviceClass compiled for classification (None selectors: it failed to compile, so
    every device counts as selected and the allocator reports the error)."""

    name: str
    expressions: tuple[str, ...]
    selectors: tuple[Selector, ...] | None
    reads: tuple[_Reads | None, ...]


@dataclass(slots=True)
class KindFacts:
    """What is known of one device kind across the cluster: a representative device (and its
    driver), and the attribute keys whose values differ between its devices."""

    device: Device
    driver: str
    varying: set[str] = field(default_factory=set)
    # The representative's values of the keys not known to vary, how to read them from
    # another device's attributes (one C-level call), and a reader of the representative's
    # varying keys (KeyError where another device lacks one): most devices add nothing new.
    _fixed: (
        tuple[
            Callable[[Mapping[str, object]], object],
            object,
            Callable[[Mapping[str, object]], object],
        ]
        | None
    ) = field(default=None, init=False, repr=False)

    def add(self, device: Device) -> bool:
        """Note another device of the kind; True when the set of varying keys grew."""
        mine, theirs = self.device.attributes, device.attributes
        if theirs is mine:
            return False
        if self._fixed is None:
            keys = [key for key in mine if key not in self.varying]
            getter = _tuple_getter(tuple(keys))
            self._fixed = (getter, getter(mine), _tuple_getter(tuple(self.varying & mine.keys())))
        read, values, varying = self._fixed
        try:
            # Of the same size, with every key of the representative (its fixed keys read,
            # its varying ones found), the two maps have the same keys.
            if len(theirs) == len(mine) and read(theirs) == values:
                varying(theirs)
                return False  # differs at most in keys known to vary
        except KeyError:
            pass
        try:
            differ = {key for key, _ in mine.items() ^ theirs.items()}
        except TypeError:  # an unhashable value: compare key by key
            differ = {
                key
                for key in mine.keys() | theirs.keys()
                if mine.get(key, _MISSING) != theirs.get(key, _MISSING)
            }
        new = differ - self.varying
        if new:
            self.varying |= new
            self._fixed = None
        return bool(new)


class Classification:
    """Every class's verdict on one device (shared by all devices that look alike)."""

    __slots__ = ("classes", "verdicts")

    def __init__(self, classifier: DeviceClassifier, verdicts: tuple[bool | None, ...]) -> None:
        self.verdicts = verdicts
        self.classes = frozenset(
            name for name, v in zip(classifier.class_names, verdicts, strict=True) if v is not False
        )


class DeviceClassifier:
    """Class membership per device, request-selector verdicts per kind (module docstring)."""

    def __init__(self, classes: Mapping[str, DeviceClass]) -> None:
        self._interned: dict[_Reads | None, _Reads | None] = {}
        self._rules: list[_ClassRule] = []
        for name in sorted(classes):
            try:
                selectors: tuple[Selector, ...] | None = tuple(
                    compile_selector(e) for e in classes[name].selectors
                )
            except BiaxialError:
                selectors = None
            reads = tuple(self._intern(s.expression) for s in selectors) if selectors else ()
            self._rules.append(_ClassRule(name, tuple(classes[name].selectors), selectors, reads))
        self._seen: dict[tuple[str, tuple[object, ...]], bool | None] = {}
        # Every class's reads at once: devices that look alike to all of them get one answer.
        everything = [r for rule in self._rules for r in rule.reads]
        self._union: _Reads | None = None
        analysable = all(rule.selectors is not None for rule in self._rules) and all(
            r is not None for r in everything
        )
        if self._rules and analysable:
            self._union = _Reads(
                frozenset().union(*(r.attributes for r in everything if r is not None)),
                frozenset().union(*(r.capacity for r in everything if r is not None)),
            )
        # The union's keys a device has, found once per set of attribute keys (devices alike
        # have the same set) when the union reads no capacity: the last set, those keys, and
        # their values' reader (one C-level call a device).
        self._union_keys: tuple[str, ...] | None = None
        if self._union is not None and not self._union.capacity:
            self._union_keys = _sorted_keys(self._union)[0]
        self._last_keys: tuple[
            frozenset[str], tuple[str, ...], Callable[[Mapping[str, object]], tuple[object, ...]]
        ] = (frozenset(), (), _NOTHING)
        self._signatures: dict[tuple[object, ...], Classification] = {}
        self._classifications: dict[tuple[bool | None, ...], Classification] = {}
        self._verdicts: dict[tuple[str, object, int], bool | None] = {}
        self._seeds: dict[tuple[object, ...], list[tuple[tuple[str, ...], list[bool | None]]]] = {}

    def _intern(self, expression: str) -> _Reads | None:
        """One :class:`_Reads` per distinct key set, so a device's looks are computed once
        for all the selectors that read the same keys."""
        reads = _reads(expression)
        return self._interned.setdefault(reads, reads)

    # ------------------------------------------------------------------ classes
    def classify(self, candidate: Candidate) -> Classification:
        """Each class's verdict on this device, in :attr:`class_names` order: True, False, or
        None when the selector cannot be compiled or evaluated on it (the allocator then meets
        the same error and reports it for the pod)."""
        union: tuple[object, ...] | None = None
        if self._union is not None:
            device, driver = candidate.device, candidate.device_id.driver
            union_keys = self._union_keys
            if union_keys is not None:
                # What _seen_as gives, its pairs split into keys and values (a tuple of
                # another length: never equal to one of its), without asking the device for
                # each of the union's keys: selectors name many strings that no device has.
                attributes = device.attributes
                keys = attributes.keys()
                last = self._last_keys
                if keys != last[0]:
                    present = tuple([k for k in union_keys if k in keys])
                    last = (frozenset(keys), present, _tuple_getter(present))
                    self._last_keys = last
                union = (
                    driver,
                    device.allow_multiple_allocations,
                    last[1],
                    last[2](attributes),
                    None,
                )
            else:
                union = _seen_as(device, driver, self._union)
            try:  # (hashed once here, not checked first: most devices were seen alike)
                known = self._signatures.get(union)
            except TypeError:
                union = None  # not hashable: ask the device
            else:
                if known is not None:
                    return known
        looks: dict[_Reads, tuple[object, ...] | None] = {}
        verdicts = tuple(self._selects(rule, candidate, looks) for rule in self._rules)
        found = self._classifications.setdefault(verdicts, Classification(self, verdicts))
        if union is not None:
            self._signatures[union] = found
        return found

    def classes_of(self, candidate: Candidate) -> frozenset[str]:
        """The classes whose selectors select this device (a CEL error counts as selecting:
        the device must stay in the bounds, the allocator reports the error)."""
        return self.classify(candidate).classes

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(rule.name for rule in self._rules)

    def answered(self, classes: Set[str]) -> bool:
        """Whether each of ``classes`` said True or False on every device classified so far
        (no CEL error, no selector that failed to compile): then devices of one kind are
        selected alike by them, and the allocator meets no error of theirs."""
        positions = [i for i, name in enumerate(self.class_names) if name in classes]
        return not any(verdicts[i] is None for verdicts in self._classifications for i in positions)

    def seed(self, candidates: NodeCandidates, verdicts: Mapping[int, Classification]) -> None:
        """Hand the allocator the class verdicts already known for a node's devices (by
        candidate index), so it never evaluates class selectors there: the per-node verdict
        lists it keeps per selector set (class selectors only, no request selectors) are
        filled in, errors left for it to meet. Nodes laid out alike (the same classification
        at each index) get copies of one set of lists, built once."""
        devices = candidates.devices
        layout = (
            len(devices),
            tuple([(i, c, devices[i].node_match) for i, c in verdicts.items()]),
        )
        lists = self._seeds.get(layout)
        if lists is None:
            lists = []
            for position, rule in enumerate(self._rules):
                if rule.selectors is None:
                    continue
                known: list[bool | None] = [None] * len(devices)
                for index, classification in verdicts.items():
                    verdict = classification.verdicts[position]
                    if verdict is not None:
                        known[index] = verdict and devices[index].node_match
                lists.append(((*rule.expressions, ""), known))
            if len(self._seeds) >= _SEED_LAYOUTS:
                self._seeds.clear()
            self._seeds[layout] = lists
        cache = candidates.verdicts
        for key, known in lists:
            if key not in cache:
                cache[key] = known.copy()  # the allocator fills in what it evaluates

    def _selects(
        self, rule: _ClassRule, cand: Candidate, memo: dict[_Reads, tuple[object, ...] | None]
    ) -> bool | None:
        if rule.selectors is None:
            return None
        device, driver = cand.device, cand.device_id.driver
        for selector, reads in zip(rule.selectors, rule.reads, strict=True):
            looks = None
            if reads is not None:
                if reads in memo:
                    looks = memo[reads]
                else:
                    looks = memo[reads] = _looks(device, driver, reads)
            if looks is not None:
                key = (selector.expression, looks)
                if key in self._seen:
                    verdict = self._seen[key]
                else:
                    verdict = self._evaluate(selector, cand)
                    self._seen[key] = verdict
            else:
                verdict = self._evaluate(selector, cand)
            if verdict is None or not verdict:
                return verdict
        return True

    def _evaluate(self, selector: Selector, cand: Candidate) -> bool | None:
        try:
            return selector.matches(cand.device, cand.device_id.driver)
        except BiaxialError:
            return None

    # ------------------------------------------------------------------ request selectors
    def verdict(
        self, expression: str, kind: object, facts: KindFacts, generation: int
    ) -> bool | None:
        """Whether every device of ``kind`` passes ``expression`` (None: they may differ, or
        it could not be evaluated). ``generation`` changes whenever the kinds' facts may have
        (cached verdicts of older generations are not reused)."""
        key = (expression, kind, generation)
        if key in self._verdicts:
            return self._verdicts[key]
        verdict: bool | None = None
        names = referenced_names(expression)
        if names is not None and not (visible_keys(names) & facts.varying):
            try:
                verdict = compile_selector(expression).matches(facts.device, facts.driver)
            except BiaxialError:
                verdict = None
        self._verdicts[key] = verdict
        return verdict


def usable(verdicts: Set[bool | None]) -> bool:
    """Whether a kind with these selector verdicts may serve a request (no verdict False)."""
    return False not in verdicts
