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
import urllib.parse
from typing import Final

from driver.cel import cost
from driver.cel.library import CELFunctionError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

# --------------------------------------------------------------------------- IP


def parse_ip(text: str) -> IPAddress:
    """Parse like Go's ``netip.ParseAddr`` with upstream's extra refusals."""
    if "%" in text:
        raise CELFunctionError(
            f"IP Address {text!r} parse error during conversion from string: "
            "IP address with zone value is not allowed"
        )
    try:
        addr = ipaddress.ip_address(text)
    except ValueError as exc:
        raise CELFunctionError(
            f"IP Address {text!r} parse error during conversion from string: {exc}"
        ) from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise CELFunctionError(
            f"IP Address {text!r} parse error during conversion from string: "
            "IPv4-mapped IPv6 address is not allowed"
        )
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

_PREFIX_BITS: Final = re.compile(r"0|[1-9][0-9]*")


def parse_cidr(text: str) -> IPInterface:
    """Parse like Go's ``netip.ParsePrefix`` (host bits may be set) with upstream's refusals."""
    address, sep, bits = text.partition("/")
    if not sep or not _PREFIX_BITS.fullmatch(bits):
        raise CELFunctionError(
            f"network address {text!r} parse error during conversion from string: "
            f"netip.ParsePrefix({text!r}): no '/'"
            if not sep
            else f"network address {text!r} parse error during conversion from string: "
            f"netip.ParsePrefix({text!r}): bad bits after slash: {bits!r}"
        )
    try:
        addr = parse_ip(address)
    except CELFunctionError as exc:
        raise CELFunctionError(
            f"network address {text!r} parse error during conversion from string: {exc}"
        ) from exc
    if int(bits) > addr.max_prefixlen:
        raise CELFunctionError(
            f"network address {text!r} parse error during conversion from string: "
            f"netip.ParsePrefix({text!r}): prefix length out of range"
        )
    return ipaddress.ip_interface(f"{addr}/{bits}")


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


def parse_url(text: str) -> urllib.parse.SplitResult:
    """Go's ``url.ParseRequestURI``: an absolute URI or an absolute path, no fragment."""
    if not text:
        raise CELFunctionError(
            f"URL parse error during conversion from string: parse {text!r}: empty url"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text) or (
        " " in text.split("?", 1)[0].split("#", maxsplit=1)[0] and "://" not in text
    ):
        raise CELFunctionError(
            f"URL parse error during conversion from string: parse {text!r}: "
            "invalid character in URL"
        )
    parts = urllib.parse.urlsplit(text, allow_fragments=False)
    if parts.scheme:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", parts.scheme):
            raise CELFunctionError(
                f"URL parse error during conversion from string: parse {text!r}: "
                "first path segment in URL cannot contain colon"
            )
        return parts
    if not text.startswith("/"):
        raise CELFunctionError(
            f"URL parse error during conversion from string: parse {text!r}: "
            "invalid URI for request"
        )
    return parts


def url(text: str) -> str:
    cost.charge_traversal(len(text))
    parse_url(text)
    return text


def is_url(text: str) -> bool:
    cost.charge(1)  # upstream has no size-dependent cost for isURL
    try:
        parse_url(text)
    except (CELFunctionError, ValueError):
        return False
    return True


def get_scheme(value: str) -> str:
    cost.charge(1)
    return urllib.parse.urlsplit(value, allow_fragments=False).scheme


def _host(value: str) -> str:
    return urllib.parse.urlsplit(value, allow_fragments=False).netloc.rpartition("@")[2]


def get_host(value: str) -> str:
    cost.charge(1)
    return _host(value)


def get_hostname(value: str) -> str:
    cost.charge(1)
    host = _host(value)
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rpartition(":")[0] if ":" in host else host


def get_port(value: str) -> str:
    cost.charge(1)
    host = _host(value)
    if host.startswith("["):
        rest = host[host.find("]") + 1 :]
        return rest[1:] if rest.startswith(":") else ""
    return host.rpartition(":")[2] if ":" in host else ""


def get_escaped_path(value: str) -> str:
    cost.charge(1)
    return urllib.parse.urlsplit(value, allow_fragments=False).path


def get_query(value: str) -> dict[str, list[str]]:
    cost.charge(1)
    query = urllib.parse.urlsplit(value, allow_fragments=False).query
    return urllib.parse.parse_qs(query, keep_blank_values=True)
