"""cel-cpp's error texts in the words upstream's users see."""

from __future__ import annotations

import re
from typing import Final

from driver.cel import (
    strings,
)

# --------------------------------------------------------------------------- messages

_STATUS_PREFIX: Final = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX: Final = re.compile(r"\s*\[[A-Z_]+\]$")
_RUNTIME_REWRITES: Final = (
    (
        re.compile(r"^No matching overloads found : <iter_range>$"),
        "expected iterable type: the range of a comprehension must be a list or a map",
    ),
    (re.compile(r"^Key not found in map : (.*)$", re.DOTALL), r"no such key: \1"),
    (re.compile(r"^No matching overloads found : (.*)$", re.DOTALL), r"no such overload: \1"),
)


def engine_message(text: str) -> str:
    """Strip absl status decorations (``INVALID_ARGUMENT: ... [INVALID_ARGUMENT]``)."""
    text = _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))
    return text.replace("ERROR: ", "")


_NO_SUCH_KEY_HINT: Final = (
    " (a device may lack an attribute or capacity: check with has() or use .?name.orValue(...))"
)


def runtime_message(text: str) -> str:
    text = engine_message(text)
    for pattern, replacement in _RUNTIME_REWRITES:
        text = pattern.sub(replacement, text)
    if text.startswith(strings.RE2_PREFIX):
        text = strings.go_regexp_error(text)
    if text.startswith("no such key:"):
        text += _NO_SUCH_KEY_HINT  # upstream's allocator adds such a hint too (kubernetes#136709)
    return text
