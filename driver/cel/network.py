"""Kubernetes' IP, CIDR and URL CEL libraries (``k8s.io/apiserver/pkg/cel/library/ip.go``,
``cidr.go``, ``urls.go``) as plain Python with upstream semantics.

* IP: ``ip(s)``, ``isIP(s)``, ``ip.isCanonical(s)``, members ``family()``, ``isUnspecified()``,
  ``isLoopback()``, ``isLinkLocalMulticast()``, ``isLinkLocalUnicast()``,
  ``isGlobalUnicast()`` (Go's ``net/netip`` definitions: private ranges are global unicast),
  ``string(ip)``. IPv4-mapped IPv6 addresses and zones are refused, as upstream.
* CIDR: ``cidr(s)``, ``isCIDR(s)``, members ``containsIP(ip | string)``,
  ``containsCIDR(cidr | string)``, ``ip()``, ``masked()``, ``prefixLength()``,
  ``string(cidr)``.
* URL: ``url(s)`` (Go's ``url.ParseRequestURI``: an absolute URI or an absolute path),
  ``isURL(s)``, members ``getScheme()``, ``getHost()``, ``getHostname()``, ``getPort()``,
  ``getEscapedPath()``, ``getQuery()``.

Values are the texts the engine wraps in its ``net.IP`` / ``net.CIDR`` / ``kubernetes.URL``
values: an IP in canonical form, a CIDR as written (``address/bits``, canonical address), a URL
as written. Every function raises :class:`~driver.cel.library.CELFunctionError` with upstream's
wording on bad input and charges its cost (``library/cost.go``) to the active meter. Pure.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from driver.cel import cost
from driver.cel.library import CELFunctionError, go_quote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

# --------------------------------------------------------------------------- IP


class _AddrError(ValueError):
    """Go's netip parseAddrError: ``ParseAddr("in"): msg (at "rest")``."""

    def __init__(self, text: str, message: str, at: str = "") -> None:
        where = f" (at {go_quote(at)})" if at else ""
        super().__init__(f"ParseAddr({go_quote(text)}): {message}{where}")


def _ipv4_fields(text: str, s: str) -> list[int]:
    fields: list[int] = []
    value, digits = 0, 0
    for i, c in enumerate(s):
        if "0" <= c <= "9":
            if digits == 1 and value == 0:
                raise _AddrError(text, "IPv4 field has octet with leading zero")
            value = value * 10 + int(c)
            digits += 1
            if value > 255:
                raise _AddrError(text, "IPv4 field has value >255")
        elif c == ".":
            if i == 0 or i == len(s) - 1 or s[i - 1] == ".":
                raise _AddrError(text, "IPv4 field must have at least one digit", s[i:])
            if len(fields) == 3:
                raise _AddrError(text, "IPv4 address too long")
            fields.append(value)
            value, digits = 0, 0
        else:
            raise _AddrError(text, "unexpected character", s[i:])
    if len(fields) < 3:
        raise _AddrError(text, "IPv4 address too short")
    return [*fields, value]


def _parse_ipv6(text: str) -> tuple[bytes, str]:
    s, zone = text, ""
    if "%" in s:
        s, _, zone = s.partition("%")
        if not zone:
            raise _AddrError(text, "zone must be a non-empty string")
    address = bytearray(16)
    ellipsis = -1
    if s.startswith("::"):
        ellipsis = 0
        s = s[2:]
        if not s:
            return bytes(address), zone
    i = 0
    while i < 16:
        off, acc = 0, 0
        while off < len(s) and s[off] in "0123456789abcdefABCDEF":
            acc = (acc << 4) + int(s[off], 16)
            off += 1
            if acc > 0xFFFF:
                raise _AddrError(text, "IPv6 field has value >=2^16", s)
        if off == 0:
            raise _AddrError(text, "each colon-separated field must have at least one digit", s)
        if off < len(s) and s[off] == ".":
            if ellipsis < 0 and i != 12:
                raise _AddrError(
                    text,
                    "embedded IPv4 address must replace the final 2 fields of the address",
                    s,
                )
            if i + 4 > 16:
                raise _AddrError(
                    text,
                    "too many hex fields to fit an embedded IPv4 at the end of the address",
                    s,
                )
            address[i : i + 4] = bytes(_ipv4_fields(text, s))
            s = ""
            i += 4
            break
        address[i] = acc >> 8
        address[i + 1] = acc & 0xFF
        i += 2
        s = s[off:]
        if not s:
            break
        if s[0] != ":":
            raise _AddrError(text, "unexpected character, want colon", s)
        if len(s) == 1:
            raise _AddrError(text, "colon must be followed by more characters", s)
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                raise _AddrError(text, "multiple :: in address", s)
            ellipsis = i
            s = s[1:]
            if not s:
                break
    if s:
        raise _AddrError(text, "trailing garbage after address", s)
    if i < 16:
        if ellipsis < 0:
            raise _AddrError(text, "address string too short")
        n = 16 - i
        address[ellipsis + n : 16] = address[ellipsis:i]
        address[ellipsis : ellipsis + n] = bytes(n)
    elif ellipsis >= 0:
        raise _AddrError(text, "the :: must expand to at least one field of zeros")
    return bytes(address), zone


def parse_addr(text: str) -> tuple[IPAddress, str]:
    """Go's ``netip.ParseAddr``, its error messages included: the address and its zone."""
    for c in text:
        if c == ".":
            return ipaddress.IPv4Address(bytes(_ipv4_fields(text, text))), ""
        if c == ":":
            raw, zone = _parse_ipv6(text)
            return ipaddress.IPv6Address(raw), zone
        if c == "%":
            raise _AddrError(text, "missing IPv6 address")
    raise _AddrError(text, "unable to parse IP")


def parse_ip(text: str) -> IPAddress:
    """Kubernetes' parseIPAddr: netip.ParseAddr, no zone, no IPv4-mapped IPv6 address."""
    try:
        addr, zone = parse_addr(text)
    except _AddrError as exc:
        raise CELFunctionError(
            f"IP Address {go_quote(text)} parse error during conversion from string: {exc}"
        ) from exc
    if zone:
        raise CELFunctionError(f"IP address {go_quote(text)} with zone value is not allowed")
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise CELFunctionError(f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return addr


def ip(text: str) -> str:
    cost.charge_traversal(len(text))
    return str(parse_ip(text))


def is_ip(text: str) -> bool:
    cost.charge_traversal(len(text))
    try:
        parse_ip(text)
    except CELFunctionError:
        return False
    return True


def is_canonical(text: str) -> bool:
    cost.charge_traversal(2 * len(text))
    return str(parse_ip(text)) == text


def family(value: str) -> int:
    cost.charge(1)
    return 4 if ipaddress.ip_address(value).version == 4 else 6


def is_unspecified(value: str) -> bool:
    cost.charge(1)
    return ipaddress.ip_address(value).is_unspecified


def is_loopback(value: str) -> bool:
    cost.charge(1)
    return ipaddress.ip_address(value).is_loopback


def is_link_local_multicast(value: str) -> bool:
    cost.charge(1)
    addr = ipaddress.ip_address(value)
    if addr.version == 4:
        return addr in _V4_LINK_LOCAL_MULTICAST
    return (int(addr) >> 112) & 0xFF0F == 0xFF02


def is_link_local_unicast(value: str) -> bool:
    cost.charge(1)
    addr = ipaddress.ip_address(value)
    if addr.version == 4:
        return addr in _V4_LINK_LOCAL
    return addr in _V6_LINK_LOCAL


def is_global_unicast(value: str) -> bool:
    """Go's ``Addr.IsGlobalUnicast``: not unspecified, loopback, multicast, link-local
    unicast or the IPv4 broadcast address."""
    cost.charge(1)
    addr = ipaddress.ip_address(value)
    if addr.is_unspecified or addr.is_loopback or addr.is_multicast:
        return False
    if addr.version == 4:
        return addr not in _V4_LINK_LOCAL and addr != _V4_BROADCAST
    return addr not in _V6_LINK_LOCAL


_V4_LINK_LOCAL: Final = ipaddress.ip_network("169.254.0.0/16")
_V4_LINK_LOCAL_MULTICAST: Final = ipaddress.ip_network("224.0.0.0/24")
_V4_BROADCAST: Final = ipaddress.ip_address("255.255.255.255")
_V6_LINK_LOCAL: Final = ipaddress.ip_network("fe80::/10")


# --------------------------------------------------------------------------- CIDR

_CIDR_ERROR: Final = "network address parse error during conversion from string: "


def _parse_prefix(text: str) -> IPInterface:
    """Go's ``netip.ParsePrefix`` (host bits may be set), its messages included."""
    where = f"netip.ParsePrefix({go_quote(text)}): "
    address, sep, bits = text.rpartition("/")
    if not sep:
        raise ValueError(where + "no '/'")
    try:
        addr, zone = parse_addr(address)
    except _AddrError as exc:
        raise ValueError(where + str(exc)) from exc
    if zone:
        raise ValueError(where + "IPv6 zones cannot be present in a prefix")
    bad = where + f"bad bits after slash: {go_quote(bits)}"
    if (len(bits) > 1 and not "1" <= bits[0] <= "9") or not re.fullmatch(r"[+-]?[0-9]+", bits):
        raise ValueError(bad)
    if not 0 <= int(bits) <= addr.max_prefixlen:
        raise ValueError(where + "prefix length out of range")
    return ipaddress.ip_interface(f"{addr}/{int(bits)}")


def parse_cidr(text: str) -> IPInterface:
    """Kubernetes' parseCIDR: netip.ParsePrefix, no IPv4-mapped IPv6 address; the message of
    cidr() as upstream's (which names the conversion twice)."""
    try:
        iface = _parse_prefix(text)
    except ValueError as exc:
        raise CELFunctionError(_CIDR_ERROR + _CIDR_ERROR + str(exc)) from exc
    if isinstance(iface.ip, ipaddress.IPv6Address) and iface.ip.ipv4_mapped is not None:
        raise CELFunctionError(
            _CIDR_ERROR + f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed"
        )
    return iface


def cidr(text: str) -> str:
    cost.charge_traversal(len(text))
    iface = parse_cidr(text)
    return f"{iface.ip}/{iface.network.prefixlen}"


def is_cidr(text: str) -> bool:
    cost.charge_traversal(len(text))
    try:
        parse_cidr(text)
    except CELFunctionError:
        return False
    return True


def _iface(value: str) -> IPInterface:
    return ipaddress.ip_interface(value)


def cidr_ip(value: str) -> str:
    cost.charge(1)
    return str(_iface(value).ip)


def masked(value: str) -> str:
    cost.charge(1)
    return str(_iface(value).network)


def prefix_length(value: str) -> int:
    cost.charge(1)
    return _iface(value).network.prefixlen


def cidr_size(value: str) -> int:
    """Upstream's size of a CIDR value: the bytes its prefix covers."""
    return -(-_iface(value).network.prefixlen // 8)


def contains_ip(value: str, other: str, *, parse: bool = False) -> bool:
    cost.charge_traversal(2 * cidr_size(value))
    if parse:
        cost.charge_traversal(len(other))
        other = str(parse_ip(other))
    addr = ipaddress.ip_address(other)
    network = _iface(value).network
    return addr.version == network.version and addr in network


def contains_cidr(value: str, other: str, *, parse: bool = False) -> bool:
    size = cidr_size(value)
    cost.charge(-(-2 * size // 10) + -(-size // 10) + 1)
    if parse:
        cost.charge_traversal(len(other))
        iface = parse_cidr(other)
        other = f"{iface.ip}/{iface.network.prefixlen}"
    mine = _iface(value).network
    theirs = _iface(other).network
    return (
        mine.version == theirs.version
        and theirs.prefixlen >= mine.prefixlen
        and theirs.network_address in mine
    )


# --------------------------------------------------------------------------- URL
#
# Go's net/url, as far as Kubernetes' URL library reads it: url() validates with
# ParseRequestURI (an absolute URI or an absolute path) and keeps url.Parse's result (which
# splits off a #fragment), whose getters are Scheme, Host, Hostname(), Port(), EscapedPath()
# and Query().


@dataclass(frozen=True, slots=True)
class GoURL:
    scheme: str = ""
    opaque: str = ""
    host: str = ""
    path: str = ""
    raw_path: str = ""
    raw_query: str = ""


class _URLError(ValueError):
    pass


def _should_escape(c: str, mode: str) -> bool:
    """Go's shouldEscape for the path, host and query-component modes."""
    if c.isascii() and c.isalnum():
        return False
    if mode == "host":
        return c not in "!$&'()*+,;=:[]<>\"-._~"  # sub-delims, brackets, quotes
    if c in "-_.~":
        return False
    if c in "$&+,/:;=?@":
        return c == "?" if mode == "path" else True
    return True


def _unescape(text: str, mode: str) -> str:
    """Go's unescape: %XX decoding (and + as space in a query component), its errors."""
    raw = text.encode()
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == ord("%"):
            digits = raw[i + 1 : i + 3].decode(errors="replace")
            if len(digits) < 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                bad = raw[i : i + 3].decode(errors="replace")
                raise _URLError(f"invalid URL escape {go_quote(bad)}")
            if mode == "host" and int(digits, 16) < 0x80 and digits != "25":
                raise _URLError(f"invalid URL escape {go_quote('%' + digits)}")
            out.append(int(digits, 16))
            i += 3
            continue
        if mode == "host" and b < 0x80 and _should_escape(chr(b), "host"):
            raise _URLError(f"invalid character {go_quote(chr(b))} in host name")
        out.append(ord(" ") if b == ord("+") and mode == "query" else b)
        i += 1
    return out.decode(errors="replace")


def _escape(text: str, mode: str) -> str:
    return "".join(
        c if not _should_escape(c, mode) else "".join(f"%{b:02X}" for b in c.encode()) for c in text
    )


def _valid_port(colon_port: str) -> bool:
    return colon_port == "" or (
        colon_port[0] == ":" and all(c in "0123456789" for c in colon_port[1:])
    )


def _parse_host(host: str) -> str:
    if host.startswith("["):
        i = host.rfind("]")
        if i < 0:
            raise _URLError("missing ']' in host")
        if not _valid_port(host[i + 1 :]):
            raise _URLError(f"invalid port {go_quote(host[i + 1 :])} after host")
    elif (i := host.rfind(":")) != -1 and not _valid_port(host[i:]):
        raise _URLError(f"invalid port {go_quote(host[i:])} after host")
    return _unescape(host, "host")


def _scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c.isascii() and c.isalpha():
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise _URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _go_parse(raw: str, via_request: bool) -> GoURL:
    """Go's url.parse."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise _URLError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise _URLError("empty url")
    if raw == "*":
        return GoURL(path="*")
    scheme, rest = _scheme(raw)
    scheme = scheme.lower()
    raw_query = ""
    if rest.endswith("?") and rest.count("?") == 1:
        rest = rest[:-1]
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return GoURL(scheme=scheme, opaque=rest, raw_query=raw_query)
        if via_request:
            raise _URLError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise _URLError("first path segment in URL cannot contain colon")
    host = ""
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, rest = rest[2:], ""
        if (i := authority.find("/")) >= 0:
            authority, rest = authority[:i], authority[i:]
        at = authority.rfind("@")
        host = _parse_host(authority[at + 1 :])
        if at >= 0:
            user = authority[:at]
            if any(
                not (c.isascii() and c.isalnum()) and c not in "-._:~!$&'()*+,;=%@" for c in user
            ):
                raise _URLError("net/url: invalid userinfo")
    path = _unescape(rest, "path")
    raw_path = "" if _escape(path, "path") == rest else rest
    return GoURL(scheme, "", host, path, raw_path, raw_query)


def parse_url(text: str) -> GoURL:
    """Go's ``url.ParseRequestURI``; raises CELFunctionError with upstream's message."""
    try:
        return _go_parse(text, via_request=True)
    except _URLError as exc:
        raise CELFunctionError(
            f"URL parse error during conversion from string: parse {go_quote(text)}: {exc}"
        ) from exc


@lru_cache(maxsize=1024)
def _url(text: str) -> GoURL:
    """Go's ``url.Parse`` of a URL ``url()`` accepted (the #fragment split off)."""
    try:
        return _go_parse(text.partition("#")[0], via_request=False)
    except _URLError as exc:
        raise CELFunctionError(
            f"URL parse error during conversion from string: parse {go_quote(text)}: {exc}"
        ) from exc


def url(text: str) -> str:
    cost.charge_traversal(len(text))
    parse_url(text)
    _url(text)
    return text


def is_url(text: str) -> bool:
    cost.charge(1)  # upstream has no size-dependent cost for isURL
    try:
        parse_url(text)
    except CELFunctionError:
        return False
    return True


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def get_scheme(value: str) -> str:
    cost.charge(1)
    return _url(value).scheme


def get_host(value: str) -> str:
    cost.charge(1)
    return _url(value).host


def get_hostname(value: str) -> str:
    cost.charge(1)
    return _split_host_port(_url(value).host)[0]


def get_port(value: str) -> str:
    cost.charge(1)
    return _split_host_port(_url(value).host)[1]


def get_escaped_path(value: str) -> str:
    """Go's EscapedPath: the path as written when that is a valid encoding of it."""
    cost.charge(1)
    parsed = _url(value)
    raw = parsed.raw_path
    if raw and all(c in "!$&'()*+,;=:@[]%" or not _should_escape(c, "path") for c in raw):
        try:
            if _unescape(raw, "path") == parsed.path:
                return raw
        except _URLError:
            pass
    if parsed.path == "*":
        return "*"
    return _escape(parsed.path, "path")


def get_query(value: str) -> dict[str, list[str]]:
    """Go's Query(): pairs split on &, those with a ; or a bad escape skipped."""
    cost.charge(1)
    out: dict[str, list[str]] = {}
    for pair in _url(value).raw_query.split("&"):
        if not pair or ";" in pair:
            continue
        key, _, val = pair.partition("=")
        try:
            out.setdefault(_unescape(key, "query"), []).append(_unescape(val, "query"))
        except _URLError:
            continue
    return out
