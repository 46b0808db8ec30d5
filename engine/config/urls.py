"""Service addresses in options and settings (the scorer's URL, ensemble members, RAY_ADDRESS):
one check that names what is wrong, so a bad port is one clear line when the value is given,
not a connection error, a timeout or a parser's traceback when it is first used."""

from __future__ import annotations

from urllib.parse import urlsplit

HTTP = ("http", "https")


def url_problem(url: str, schemes: tuple[str, ...] = HTTP, bare: bool = False) -> str | None:
    """What is wrong with `url`, None when nothing is: its scheme must be one of `schemes`
    (`bare` also allows a plain host:port), it must name a host, and a port must be a
    decimal number from 1 to 65535."""
    text = url.strip()
    if bare and "://" not in text:
        text = f"//{text}"
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        return f"is not a URL ({exc})"
    if parts.scheme not in schemes and not (bare and not parts.scheme):
        return f"must start with {' or '.join(f'{s}://' for s in schemes)}"
    if not parts.hostname:
        return "names no host"
    port = parts.netloc.rpartition("]")[2].rpartition("@")[2].partition(":")[2]
    if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"has port {port[:20]!r}: a port is a number from 1 to 65535"
    return None
