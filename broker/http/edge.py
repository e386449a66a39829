"""The broker's network edge: TLS, listeners, and who may call from where.

Job: everything between a TCP connection and a handler's role check.

- **TLS.** With ``tls_cert`` and ``tls_key`` the broker serves HTTPS and WSS itself (`tls_context`).
  SIGHUP reloads the certificate and key into the same context (`TlsReloader`): new handshakes use
  the new pair, open connections keep theirs, and a pair that does not load is logged and the old
  one kept (a renewal job that wrote half a file never takes the broker down).
- **Listeners.** The public listener (``host``/``port``) serves users and nodes.  With
  ``admin_listen`` (``host:port``) a second listener on the same application serves the admin API
  and ``/metrics``; the public one then refuses admin tokens (403) and answers 404 for
  ``/metrics``, so the admin API can sit on an internal address only.
- **Address allow-lists.** ``admin_allow`` and ``node_allow`` (CIDRs) restrict where admin and node
  tokens are accepted from; users are not restricted (they come from anywhere).  Behind a reverse
  proxy the peer is the proxy: ``trusted_proxies`` lists the proxies whose ``X-Forwarded-For`` is
  believed (the right-most address not itself a trusted proxy is the client).

The address rules (`parse_networks`, `client_address`, `role_allowed`) are pure and table-tested;
`check_access` applies them to a request once its principal is known (``broker.http.api.principal``).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiohttp import web

from broker.errors import Forbidden, NotFound, ValidationError
from broker.protocol import Role

if TYPE_CHECKING:
    from broker.auth import Principal
    from broker.settings import BrokerSettings

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

def parse_networks(text: str | list[str], field: str) -> tuple[Network, ...]:
    """Comma-separated (or listed) addresses or CIDRs; a bad one is a ValidationError naming ``field``."""
    items = text if isinstance(text, list) else text.split(",")
    out: list[Network] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValidationError(f"{field}: {item!r} is not an address or CIDR ({exc})", field=field) from None
    return tuple(out)


def parse_listen(text: str, field: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` for IPv6) or empty for none."""
    text = text.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError(f"{field}: expected host:port, got {text!r}", field=field)
    return host, int(port)


def _ip(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _within(ip: Address, nets: tuple[Network, ...]) -> bool:
    return any(ip.version == n.version and ip in n for n in nets)


def client_address(peer: str, forwarded_for: str | None, trusted: tuple[Network, ...]) -> Address | None:
    """The caller's address: the peer, or, when the peer is a trusted proxy, the right-most
    ``X-Forwarded-For`` entry that is not itself a trusted proxy (entries to its left are whatever
    the client claimed and are never believed).  None when no address can be read."""
    ip = _ip(peer)
    if ip is None or not forwarded_for or not _within(ip, trusted):
        return ip
    for hop in reversed(forwarded_for.split(",")):
        hop_ip = _ip(hop)
        if hop_ip is None:
            return ip  # a malformed chain: trust only what we saw
        if not _within(hop_ip, trusted):
            return hop_ip
        ip = hop_ip
    return ip


def role_allowed(role: Role, ip: Address | None, admin_allow: tuple[Network, ...],
                 node_allow: tuple[Network, ...]) -> bool:
    """Whether a caller of ``role`` at ``ip`` may be served (an empty list allows every address)."""
    nets = admin_allow if role == Role.ADMIN else node_allow if role == Role.NODE else ()
    if not nets:
        return True
    return ip is not None and _within(ip, nets)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context for HTTPS/WSS (TLS 1.2+, the default ciphers of this OpenSSL)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class TlsReloader:
    """Reload the certificate and key into a live context (SIGHUP); keep the old pair on failure."""

    def __init__(self, ctx: ssl.SSLContext, cert: str, key: str) -> None:
        self.ctx, self.cert, self.key = ctx, cert, key
        self.reloads = 0

    def reload(self) -> bool:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert, self.key)  # check first
            self.ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, keeping the current certificate: %s", exc)
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert)
        return True


@dataclass(frozen=True)
class Edge:
    """The edge rules of one broker process, built once from its settings."""

    admin: tuple[str, int] | None  # the admin listener's address, None = one listener serves everything
    admin_allow: tuple[Network, ...] = ()
    node_allow: tuple[Network, ...] = ()
    trusted_proxies: tuple[Network, ...] = ()

    @classmethod
    def from_settings(cls, s: BrokerSettings) -> Edge:
        return cls(admin=parse_listen(s.admin_listen, "admin_listen"),
                   admin_allow=parse_networks(s.admin_allow, "admin_allow"),
                   node_allow=parse_networks(s.node_allow, "node_allow"),
                   trusted_proxies=parse_networks(s.trusted_proxies, "trusted_proxies"))

    def on_admin_listener(self, request: web.Request) -> bool:
        if self.admin is None:
            return True
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return isinstance(sockname, tuple) and len(sockname) >= 2 and sockname[1] == self.admin[1]

    def check(self, request: web.Request, who: Principal) -> None:
        """403 when ``who`` may not be served here: an admin token on the public listener while an
        admin listener exists, or an admin/node token from an address outside its allow-list."""
        if who.role == Role.ADMIN and not self.on_admin_listener(request):
            raise Forbidden("admin tokens are served on the admin listener (admin_listen) only",
                            field="Authorization")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ip = client_address(peer[0] if peer else "", request.headers.get("X-Forwarded-For"), self.trusted_proxies)
        if not role_allowed(who.role, ip, self.admin_allow, self.node_allow):
            raise Forbidden(f"{who.role.value} tokens are not accepted from {ip} (admin_allow / node_allow)",
                            field="Authorization")

    def check_metrics(self, request: web.Request) -> None:
        """``/metrics`` lives on the admin listener when there is one (and follows admin_allow)."""
        if not self.on_admin_listener(request):
            raise NotFound("/metrics is served on the admin listener (admin_listen)")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ip = client_address(peer[0] if peer else "", request.headers.get("X-Forwarded-For"), self.trusted_proxies)
        if not role_allowed(Role.ADMIN, ip, self.admin_allow, ()):
            raise Forbidden(f"/metrics is not served to {ip} (admin_allow)")


EDGE: Final = web.AppKey("edge", Edge)  # set by broker.app.create_app from the settings


def check_access(request: web.Request, who: Principal) -> None:
    """Apply the application's edge rules, if it has any, to an authenticated caller."""
    edge = request.app.get(EDGE)
    if edge is not None:
        edge.check(request, who)


def check_metrics(request: web.Request) -> None:
    edge = request.app.get(EDGE)
    if edge is not None:
        edge.check_metrics(request)
