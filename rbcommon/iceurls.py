"""STUN and TURN URLs as the broker hands them to browsers and render nodes (RFC 7064, RFC 7065).

Job: check ``stun_urls`` / ``turn_urls`` once at startup, so a typo is one line naming the
setting instead of a session that fails on the node (whose aiortc refuses the URL) or in the
browser.  Accepted: ``stun:`` / ``stuns:`` ``host[:port]``; ``turn:`` ``host[:port][?transport=udp|tcp]``
and ``turns:`` ``host[:port][?transport=tcp]`` (TURN over TLS; ``turns`` over UDP would be DTLS,
which neither aiortc nor browsers speak).  A host is a DNS name or an IPv4 address: the node's ICE
stack (aiortc) cannot parse a bracketed IPv6 literal.  Default ports: 3478, 5349 for ``stuns``/``turns``.

Invariant: a URL ``parse_ice_url`` accepts is one aiortc's ``parse_stun_turn_uri`` parses to the
same scheme, host, port and transport (tests/rbcommon/test_iceurls.py compares them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["IceUrl", "check_ice_urls", "parse_ice_url"]

_URL = re.compile(r"(?P<scheme>stuns?|turns?):(?P<host>[A-Za-z0-9.\-]+)(?::(?P<port>[0-9]{1,5}))?"
                  r"(?:\?transport=(?P<transport>[a-z]+))?")
_DEFAULT_PORT = {"stun": 3478, "turn": 3478, "stuns": 5349, "turns": 5349}


@dataclass(frozen=True)
class IceUrl:
    scheme: str  # stun, stuns, turn, turns
    host: str
    port: int
    transport: str | None  # udp/tcp for turn(s); None for stun(s)

    @property
    def tls(self) -> bool:
        return self.scheme in ("stuns", "turns")


def parse_ice_url(url: str) -> IceUrl:
    """Parse one URL; ``ValueError`` says what is wrong with it."""
    if url.startswith("[") or "[" in url:
        raise ValueError(f"{url!r}: IPv6 literals are not supported by the node's ICE stack; use a DNS name")
    m = _URL.fullmatch(url)
    if m is None:
        raise ValueError(f"{url!r}: expected stun:HOST[:PORT], stuns:HOST[:PORT], turn:HOST[:PORT][?transport=udp|tcp]"
                         " or turns:HOST[:PORT][?transport=tcp]")
    scheme, host, transport = m["scheme"], m["host"], m["transport"]
    port = int(m["port"]) if m["port"] else _DEFAULT_PORT[scheme]
    if not 1 <= port <= 65535:
        raise ValueError(f"{url!r}: port must be 1..65535")
    if scheme.startswith("stun"):
        if transport is not None:
            raise ValueError(f"{url!r}: a {scheme} URL takes no transport")
    elif transport is None:
        transport = "tcp" if scheme == "turns" else "udp"
    elif transport not in ("udp", "tcp"):
        raise ValueError(f"{url!r}: transport must be udp or tcp")
    elif scheme == "turns" and transport == "udp":
        raise ValueError(f"{url!r}: turns (TLS) runs over tcp; TURN over DTLS is not supported")
    return IceUrl(scheme, host, port, transport)


def check_ice_urls(urls: list[str], field: str, schemes: tuple[str, ...]) -> list[IceUrl]:
    """Parse every URL of setting ``field``; ``ValueError`` names the field and the URL."""
    out: list[IceUrl] = []
    for url in urls:
        try:
            parsed = parse_ice_url(url)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
        if parsed.scheme not in schemes:
            raise ValueError(f"{field}: {url!r}: expected a {' or '.join(schemes)} URL")
        out.append(parsed)
    return out
