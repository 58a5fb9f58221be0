"""Kubernetes' named formats (``k8s.io/apiserver/pkg/cel/library/format.go``) as plain Python:
``format.named(name)``, ``format.<name>()`` and ``<format>.validate(s)``, which returns the
validation errors (upstream wraps them in an optional: none when valid). The validators are
apimachinery's (``IsDNS1123Label``, ``IsDNS1123Subdomain``, ``IsDNS1035Label``,
``IsQualifiedName``, ``IsValidLabelValue``, the ``*Prefix`` variants that mask a trailing dash)
and kube-openapi's strfmt checks (``uuid``, ``byte``, ``date``, ``datetime``), with their exact
messages; ``uri`` is Go's ``url.ParseRequestURI``. Pure module.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from driver.cel import network
from driver.cel.library import CELFunctionError

MAX_FORMAT_NAME: Final = 64  # apiserver cel.MaxFormatSize


@dataclass(frozen=True, slots=True)
class NamedFormat:
    name: str  # upstream's Format.Name (equality compares it)
    validate: Callable[[str], list[str]]
    max_regex_size: int  # the regular expression size its validation cost assumes


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    """apimachinery's RegexError."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(length: int) -> str:
    return f"must be no more than {length} characters"


_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and"
    " must start and end with an alphanumeric character"
)
_SUBDOMAIN_FMT: Final = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character"
)
_DNS1035_FMT: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_MSG: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an"
    " alphabetic character, and end with an alphanumeric character"
)
_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an"
    " alphanumeric character"
)
_VALUE_FMT: Final = "(" + _KEY_FMT + ")?"
_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or"
    " '.', and must start and end with an alphanumeric character"
)
_LABEL: Final = re.compile(_LABEL_FMT)
_SUBDOMAIN: Final = re.compile(_SUBDOMAIN_FMT)
_DNS1035: Final = re.compile(_DNS1035_FMT)
_KEY: Final = re.compile(_KEY_FMT)
_VALUE: Final = re.compile(_VALUE_FMT)


def is_dns1123_label(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value.encode()) > 63 else []
    if not _LABEL.fullmatch(value):
        if _SUBDOMAIN.fullmatch(value):
            errs.append("must not contain dots")
        else:
            errs.append(_regex_error(_LABEL_MSG, _LABEL_FMT, "my-name", "123-abc"))
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = [_max_len(253)] if len(value.encode()) > 253 else []
    if not _SUBDOMAIN.fullmatch(value):
        errs.append(_regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    return errs


def is_dns1035_label(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value.encode()) > 63 else []
    if not _DNS1035.fullmatch(value):
        errs.append(_regex_error(_DNS1035_MSG, _DNS1035_FMT, "my-name", "abc-123"))
    return errs


def is_qualified_name(value: str) -> list[str]:
    """apimachinery's IsQualifiedName (a label key: an optional DNS subdomain prefix and /)."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + m for m in is_dns1123_subdomain(prefix)]
    else:
        return [
            "a valid label key "
            + _regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errs.append("name part " + _max_len(63))
    if not _KEY.fullmatch(name):
        errs.append("name part " + _regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc"))
    return errs


def is_label_value(value: str) -> list[str]:
    errs = [_max_len(63)] if len(value.encode()) > 63 else []
    if not _VALUE.fullmatch(value):
        errs.append(_regex_error(_VALUE_MSG, _VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _mask_trailing_dash(name: str) -> str:
    """apimachinery's maskTrailingDash (it drops the last *two* characters, as upstream)."""
    if len(name.encode()) > 1 and name.endswith("-"):
        return name.encode()[:-2].decode(errors="ignore") + "a"
    return name


# Go's $ is the end of the text; Python's \Z is.
_UUID: Final = re.compile(r"(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
UUID_PATTERN_SIZE: Final = 70  # len(strfmt.UUIDPattern)
_BASE64: Final = re.compile(
    r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
)
_DATE: Final = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME: Final = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")
DATETIME_PATTERN_SIZE: Final = 71  # len(strfmt.DateTimePattern)


def is_date(text: str) -> bool:
    """Go's time.Parse("2006-01-02", s): four digits, two, two, a real day."""
    match = _DATE.fullmatch(text)
    if match is None:
        return False
    try:
        dt.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return False
    return True


def is_datetime(text: str) -> bool:
    """kube-openapi strfmt IsDateTime."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not is_date(parts[0]):
        return False
    match = _TIME.fullmatch(parts[1])
    if match is None:
        return False
    return match[1] <= "23" and match[2] <= "59" and match[3] <= "59"


def _uri(text: str) -> list[str]:
    try:
        network.parse_url(text)
    except CELFunctionError as exc:
        return [str(exc).removeprefix("URL parse error during conversion from string: ")]
    return []


def _check(ok: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda s: [] if ok(s) else [message]


FORMATS: Final[dict[str, NamedFormat]] = {
    "dns1123Label": NamedFormat("DNS1123Label", is_dns1123_label, 30),
    "dns1123Subdomain": NamedFormat("DNS1123Subdomain", is_dns1123_subdomain, 60),
    "dns1035Label": NamedFormat("DNS1035Label", is_dns1035_label, 30),
    "qualifiedName": NamedFormat("QualifiedName", is_qualified_name, 60),
    "dns1123LabelPrefix": NamedFormat(
        "DNS1123LabelPrefix", lambda s: is_dns1123_label(_mask_trailing_dash(s)), 30
    ),
    "dns1123SubdomainPrefix": NamedFormat(
        "DNS1123SubdomainPrefix", lambda s: is_dns1123_subdomain(_mask_trailing_dash(s)), 60
    ),
    "dns1035LabelPrefix": NamedFormat(
        "DNS1035LabelPrefix", lambda s: is_dns1035_label(_mask_trailing_dash(s)), 30
    ),
    "labelValue": NamedFormat("LabelValue", is_label_value, 40),
    "uri": NamedFormat("URI", _uri, 1103),
    "uuid": NamedFormat(
        "uuid",
        _check(lambda s: bool(_UUID.fullmatch(s)), "does not match the UUID format"),
        UUID_PATTERN_SIZE,
    ),
    "byte": NamedFormat("byte", _check(lambda s: bool(_BASE64.fullmatch(s)), "invalid base64"), 84),
    "date": NamedFormat("date", _check(is_date, "invalid date"), DATETIME_PATTERN_SIZE),
    "datetime": NamedFormat(
        "datetime", _check(is_datetime, "invalid datetime"), DATETIME_PATTERN_SIZE
    ),
}
BY_NAME: Final = {f.name: f for f in FORMATS.values()}


def named(key: str) -> NamedFormat | None:
    """``format.named(key)``: the format, or None (upstream: optional.none())."""
    return FORMATS.get(key)


def of(name: str) -> NamedFormat:
    """The format whose upstream Name is *name* (how the engine's values carry it)."""
    found = BY_NAME.get(name)
    if found is None:
        raise CELFunctionError(f"no such format: {name!r}")
    return found
