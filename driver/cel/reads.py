"""What a DRA selector can read of a device, so devices that look the same to it share a verdict.

A selector reads ``device.driver``, ``device.allowMultipleAllocations`` and the attributes and
capacities its expression names. :func:`referenced_names` finds those names conservatively from
the expression text (None when it may read names it does not spell out: comprehensions,
``size``, ``has``, ``in``, computed or optional indexes, escapes); :func:`visible` is what such
a selector sees of one device. Two devices with equal :func:`visible` values give the same
boolean result (a CEL error is per device: its message names the device). Pure functions.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from driver.api.model import Device

_DYNAMIC_ACCESS: Final = re.compile(
    r"\b(?:all|exists|exists_one|existsOne|map|filter|size|has|transformList|transformMap"
    r"|transformMapEntry)\s*\(|\bin\b|[?\\@{]"
)
_LITERAL_INDEX: Final = re.compile(r"\[\s*(\"[^\"\\]*\"|'[^'\\]*')\s*\]")
_TOKEN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A domain's map (``attributes["d"]``) or a device's whole map (``attributes``) used as a
# value, not indexed further: compared, converted or passed on, it reads every name in it.
_WHOLE_MAP: Final = re.compile(
    r"\b(?:attributes|capacity)\b(?!\s*\[)"
    r"|\b(?:attributes|capacity)\s*\[\s*(?:\"[^\"\\]*\"|'[^'\\]*')\s*\](?!\s*[.\[])"
)


def referenced_names(expression: str) -> frozenset[str] | None:
    """Every name a CEL selector can read from a device, or None when it may read names it
    does not spell out (comprehensions, ``size``, ``has``, ``in``, computed or optional
    indexes, escapes, a map used whole: ``attributes["d"] == attributes["e"]``). Conservative:
    a word anywhere in the text, string literals included, counts as referenced."""
    if _DYNAMIC_ACCESS.search(expression) or _WHOLE_MAP.search(expression):
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


@functools.lru_cache(maxsize=1024)
def readable_keys(expression: str) -> frozenset[str] | None:
    """:func:`visible_keys` of what ``expression`` references (None: it may read anything)."""
    names = referenced_names(expression)
    return visible_keys(names) if names is not None else None


def visible(device: Device, driver: str, keys: frozenset[str]) -> tuple[object, ...]:
    """What a selector that reads only ``keys`` sees of a device."""
    attributes = device.attributes
    capacity = device.capacity
    return (
        driver,
        device.allow_multiple_allocations,
        tuple((k, attributes[k]) for k in sorted(attributes.keys() & keys)),
        tuple((k, capacity[k].value.nanos) for k in sorted(capacity.keys() & keys)),
    )


__all__ = ["readable_keys", "referenced_names", "visible", "visible_keys"]
