"""A guard for YAML text before libyaml parses it.

libyaml's parser (PyYAML's ``CSafeLoader``, 10x faster than the pure-Python one on a cluster
dump) recurses in C for every nested collection and overflows the C stack on deeply nested
input: the process crashes instead of raising an error. :func:`too_deep` tells, cheaply,
whether text may nest deeper than :data:`MAX_DEPTH` (by flow brackets or by indentation), so
the caller refuses it with a message first. Brackets inside strings count too; no manifest or
GPU profile comes near the limit. Pure.
"""

from __future__ import annotations

import re
from typing import Final

MAX_DEPTH: Final = 1000
_BRACKETS: Final = re.compile(r"[\[\]{}]")
_DEEP_INDENT: Final = re.compile(rf"^[ \t-]{{{MAX_DEPTH},}}", re.MULTILINE)


def too_deep(text: str) -> bool:
    """Whether ``text`` may nest deeper than :data:`MAX_DEPTH` (see the module docstring)."""
    if _DEEP_INDENT.search(text):
        return True
    depth = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif depth:
            depth -= 1
    return False
