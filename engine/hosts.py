"""Whether a bind address keeps a service on this machine.

`eslab serve` and `eslab scorer serve` stay open (no login, no token) only on loopback, so
both ask the same question here: the one rule for what "this machine only" means."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True when every address `host` stands for is a loopback one (127.0.0.0/8, ::1, or a
    name such as localhost that resolves only to those). A wildcard (0.0.0.0, ::, ""), a LAN
    address, a name that resolves to any other address, or a name that does not resolve
    counts as reachable from other machines: an unknown bind is never treated as private."""
    host = host.strip().strip("[]")  # "[::1]" as URLs write it
    if not host:
        return False
    try:
        return _loopback_ip(host)
    except ValueError:
        pass  # a name, resolved below
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(_loopback_ip(a.split("%")[0]) for a in addresses)


def _loopback_ip(text: str) -> bool:
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1
    return address.is_loopback


def is_loopback_address(host: str) -> bool:
    """True for a loopback IP literal or `localhost`, without resolving anything: for
    deciding where a secret may be sent, a name that resolves to loopback now may resolve
    elsewhere by the time the request is made."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return _loopback_ip(host)
    except ValueError:
        return False
