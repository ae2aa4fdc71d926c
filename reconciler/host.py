"""One value for a node's address: parsed once, at load, and asked everywhere.

An address reaches many places (engine flags, URLs, health checks, host-key
lines, loopback checks) and each wants it spelt differently: `fd00::1` for
`--master-addr`, `[fd00::1]:8000` after a port, `http://[fd00::1]:8000` in a
URL. Every spelling comes from here, so no caller strips or adds brackets.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import field
from functools import lru_cache

from reconciler.frozen import frozen

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The loopback names distributions put in /etc/hosts, besides localhost itself.
LOOPBACK_NAMES = frozenset({
    "localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4",
    "localhost6", "localhost6.localdomain6", "ip6-localhost", "ip6-loopback",
})
HOST_LABEL_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")


def _ip(host: str) -> IPAddress | None:
    """`host` as an IP when it is one in any spelling connect() accepts (inet_aton forms included)."""
    try:
        ip: IPAddress = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip


def _dotted_quad(text: str) -> ipaddress.IPv4Address | None:
    """`text` as an IPv4 address when it is one in dotted-quad form, exactly as ipaddress reads it
    (four decimal octets, no leading zeros), or None. inet_pton reads it in C: ipaddress's own parse
    costs tens of microseconds, and a 4,000-node fleet.yaml has 8,000 addresses."""
    try:
        return ipaddress.IPv4Address(socket.inet_pton(socket.AF_INET, text))
    except (OSError, ValueError):
        return None


@frozen
class Host:
    """A host as written in fleet.yaml (`10.0.0.1`, `[fd00::1]`, `gpu-a1.example`).

    bare          what engines and sockets take: no brackets (`fd00::1`)
    canonical     one spelling per machine: `10.1.11` and `::ffff:10.1.0.11` are `10.1.0.11`
    ip            the IP it is, in any spelling connect() accepts; None for a name
    """

    written: str
    bare: str = field(init=False, compare=False)
    canonical: str = field(init=False, compare=False)
    ip: IPAddress | None = field(init=False, compare=False, repr=False)
    # The IP literal as written (`10.1.11` is not one), parsed once: placement and validation ask a
    # 4,000-node fleet's hosts several times each.
    _literal: IPAddress | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        text = self.written.strip()
        bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        literal = _dotted_quad(bare)
        if literal is not None:  # the common case, parsed in C: canonical as written
            ip, canonical = literal, bare
        else:
            lowered = bare.lower().rstrip(".")
            try:
                literal = ipaddress.ip_address(bare)
            except ValueError:
                literal = None
            if literal is not None and lowered == bare:  # the same parse _ip would start with
                ip = literal.ipv4_mapped if literal.version == 6 and literal.ipv4_mapped is not None else literal
            else:
                ip = _ip(lowered)
            canonical = str(ip) if ip is not None else lowered
        object.__setattr__(self, "bare", bare)
        object.__setattr__(self, "ip", ip)
        object.__setattr__(self, "canonical", canonical)
        object.__setattr__(self, "_literal", literal)

    def __str__(self) -> str:
        return self.bare

    @property
    def is_ip(self) -> bool:
        """An IP literal as written (strictly: `10.1.11` is an IP to connect(), not a literal)."""
        return self._literal is not None

    @property
    def is_ipv6(self) -> bool:
        return self._literal is not None and self._literal.version == 6

    @property
    def loopback_ip(self) -> str | None:
        """The canonical IP when this names this machine (any spelling connect() accepts, the usual
        /etc/hosts names, and the unspecified address, which a connect() turns into this host)."""
        name = self.bare.lower().rstrip(".")
        if name in LOOPBACK_NAMES or name.endswith(".localhost"):
            return "::1" if "6" in name else "127.0.0.1"
        ip = self.ip
        return str(ip) if ip is not None and (ip.is_loopback or ip.is_unspecified) else None

    @property
    def is_loopback(self) -> bool:
        return self.loopback_ip is not None

    @property
    def is_valid(self) -> bool:
        """An IP address or a DNS host name: what engines and clients can dial. Nothing else (a comma
        or space would splice another endpoint into `--rpc a:1,b:2`)."""
        if self.is_ip:
            return True
        name = self.bare[:-1] if self.bare.endswith(".") else self.bare
        return 0 < len(name) <= 253 and all(HOST_LABEL_RE.match(label) for label in name.split("."))

    def with_port(self, port: int) -> str:
        """`host:port`, an IPv6 literal bracketed so the port is not read as part of it."""
        return f"[{self.bare}]:{port}" if self.is_ipv6 else f"{self.bare}:{port}"

    def url(self, port: int, path: str = "", scheme: str = "http") -> str:
        return f"{scheme}://{self.with_port(port)}{path}"


@lru_cache(maxsize=1 << 16)
def parse_host(written: str) -> Host:
    """Host(written), parsed once per spelling: a 4,000-node fleet.yaml's addresses are asked about by
    several checks and by every NodeSpec, and an IPv4 parse costs tens of microseconds in Python."""
    return Host(written)
