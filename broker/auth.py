"""Bearer-token authentication: admin token, node bootstrap token, HMAC-signed user tokens and
per-host node credentials; HMAC keys rotate with an overlap window.

Signed tokens are ``<kind>.<base64url(json claims)>.<base64url(hmac-sha256(key, "<kind>.<claims>"))>``:

- ``u1`` user token, claims ``{"u": user, "exp": epoch_s}`` (minted by ``POST /tokens``, ``/guest``);
- ``n1`` node credential, claims ``{"h": host_id, "exp": epoch_s}``: bound to one host id, minted
  by ``POST /hosts`` (registration with the shared node token) and renewed in heartbeat replies;
- ``s1`` share token, claims ``{"s": session_id, "i": share_id, "r": role, "exp": epoch_s}``: lets a
  viewer watch one session (``POST /sessions/{id}/shares``); accepted only by the watch page and the
  viewer's signaling socket, never as a REST credential.  Revocation is a Redis marker per share id
  (``broker.store.keys``), so a revoked token stays valid-looking here: callers check the marker.

The kind is inside the signed text, so a user token never passes as a node credential (or the
reverse).  Any replica verifies either without shared state.

Key rotation: tokens are signed with the newest key (``keys[0]``, the ``secret`` setting) and
verified with any key in ``keys`` (``secret`` then ``previous_secrets``).  A token signed with an
older key still verifies, and the principal says so (``key_index > 0``) so the broker can hand a
node a fresh credential before that key is removed.

Admin and node bootstrap tokens are static secrets compared in constant time.  The node token
(role node, ``host`` None) only registers hosts; every per-host route asks for a credential whose
``host`` is the host it names (see ``broker.http.api.require_host``).

Also builds per-session TURN credentials in the TURN REST scheme that coturn's
``use-auth-secret`` accepts: username ``<expiry>:<session>``, password
``base64(hmac-sha1(secret, username))``.

Pure: every function takes ``now_s`` where time matters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import Unauthorized
from broker.protocol import Role

USER_TOKEN_VERSION = "u1"
NODE_CREDENTIAL_VERSION = "n1"
SHARE_TOKEN_VERSION = "s1"

Keys = str | Sequence[str]  # one key, or the verification keys newest first


@dataclass(frozen=True)
class Principal:
    role: Role
    name: str  # user name, "admin", "node" (the bootstrap token) or the host id of a node credential
    host: str | None = None  # the host a node credential is bound to; None for every other token
    expires_at: int | None = None  # epoch s of a signed token's expiry; None for static tokens
    key_index: int = 0  # which verification key matched (0 = the newest; > 0 = an older, rotating-out key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _key_list(keys: Keys) -> list[str]:
    out = [keys] if isinstance(keys, str) else [k for k in keys if k]
    return out or [""]


def _sign(key: str, text: str) -> bytes:
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).digest()


def _mint(keys: Keys, kind: str, claims: dict[str, Any]) -> str:
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{kind}.{body}.{_b64(_sign(_key_list(keys)[0], f'{kind}.{body}'))}"


def _verify(keys: Keys, token: str, kind: str, name_claim: str, now_s: float) -> tuple[str, int, int]:
    """(name claim, expiry, index of the key that signed it); Unauthorized when forged, malformed or expired."""
    claims, index = _verify_claims(keys, token, kind, name_claim, now_s)
    return str(claims[name_claim]), int(claims["exp"]), index


def _verify_claims(keys: Keys, token: str, kind: str, name_claim: str, now_s: float) -> tuple[dict[str, Any], int]:
    """(claims, index of the key that signed them); Unauthorized when forged, malformed or expired."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != kind:
        raise Unauthorized("malformed token")
    try:
        got = _unb64(parts[2])
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unauthorized("malformed token") from exc
    signed = f"{parts[0]}.{parts[1]}"
    # every key is tried (no early exit), so the time taken says nothing about which one matched
    matched = [i for i, key in enumerate(_key_list(keys)) if hmac.compare_digest(_sign(key, signed), got)]
    if not matched:
        raise Unauthorized("bad token signature")
    if not isinstance(claims, dict) or not isinstance(claims.get(name_claim), str) \
            or not isinstance(claims.get("exp"), int):
        raise Unauthorized("malformed token claims")
    if claims["exp"] <= now_s:
        raise Unauthorized("token expired")
    return claims, matched[0]


def mint_user_token(secret: Keys, user: str, now_s: float, ttl_s: int) -> tuple[str, int]:
    """A signed token for ``user`` expiring ``ttl_s`` from ``now_s``; returns (token, expiry epoch s).
    Signed with the newest key when given the key list."""
    exp = int(now_s) + int(ttl_s)
    return _mint(secret, USER_TOKEN_VERSION, {"u": user, "exp": exp}), exp


def verify_user_token(secret: Keys, token: str, now_s: float) -> str:
    """The user a token names; raises Unauthorized if it is forged, malformed or expired."""
    return _verify(secret, token, USER_TOKEN_VERSION, "u", now_s)[0]


def mint_node_credential(keys: Keys, host_id: str, now_s: float, ttl_s: int) -> tuple[str, int]:
    """A credential bound to ``host_id``, expiring ``ttl_s`` from ``now_s``: (token, expiry epoch s)."""
    exp = int(now_s) + int(ttl_s)
    return _mint(keys, NODE_CREDENTIAL_VERSION, {"h": host_id, "exp": exp}), exp


def verify_node_credential(keys: Keys, token: str, now_s: float) -> Principal:
    """The node principal a credential names (``host`` set); Unauthorized if forged, malformed or expired."""
    host, exp, index = _verify(keys, token, NODE_CREDENTIAL_VERSION, "h", now_s)
    return Principal(Role.NODE, host, host=host, expires_at=exp, key_index=index)


@dataclass(frozen=True)
class ShareGrant:
    """What a verified share token allows: watching ``session`` through share ``share_id`` in ``role``."""

    session: str
    share_id: str
    role: str
    expires_at: int  # epoch s


def mint_share_token(keys: Keys, session_id: str, share_id: str, role: str, now_s: float,
                     ttl_s: int) -> tuple[str, int]:
    """A token for watching ``session_id`` through share ``share_id``: (token, expiry epoch s)."""
    exp = int(now_s) + int(ttl_s)
    return _mint(keys, SHARE_TOKEN_VERSION, {"s": session_id, "i": share_id, "r": role, "exp": exp}), exp


def verify_share_token(keys: Keys, token: str, now_s: float) -> ShareGrant:
    """The grant a share token carries; Unauthorized if forged, malformed or expired (revocation is the
    caller's check: a marker in Redis)."""
    claims, _ = _verify_claims(keys, token, SHARE_TOKEN_VERSION, "s", now_s)
    if not isinstance(claims.get("i"), str) or not isinstance(claims.get("r"), str):
        raise Unauthorized("malformed token claims")
    return ShareGrant(str(claims["s"]), str(claims["i"]), str(claims["r"]), int(claims["exp"]))


def needs_renewal(who: Principal, now_s: float, ttl_s: int) -> bool:
    """Should a heartbeat reply carry a fresh credential?  Yes for a node credential past half its
    life or signed with an older key (so removing that key after the overlap logs no node out), and
    for the bootstrap token (a node that registered before credentials existed picks one up)."""
    if who.role != Role.NODE:
        return False
    if who.host is None or who.expires_at is None:
        return True
    return who.key_index > 0 or who.expires_at - now_s < ttl_s / 2


def authenticate(header: str | None, *, admin_token: str, node_token: str, secret: Keys, now_s: float) -> Principal:
    """Resolve an ``Authorization`` header to a principal or raise Unauthorized.  ``secret``: the
    HMAC key, or the verification keys newest first."""
    if not header:
        raise Unauthorized("missing Authorization: Bearer <token>")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("expected Authorization: Bearer <token>")
    token = token.strip()
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(Role.ADMIN, "admin")
    if hmac.compare_digest(token.encode(), node_token.encode()):
        return Principal(Role.NODE, "node")
    if token.startswith(NODE_CREDENTIAL_VERSION + "."):
        return verify_node_credential(secret, token, now_s)
    user, exp, index = _verify(secret, token, USER_TOKEN_VERSION, "u", now_s)
    return Principal(Role.USER, user, expires_at=exp, key_index=index)


def turn_credentials(secret: str, session_id: str, now_s: float, ttl_s: int) -> tuple[str, str]:
    """coturn REST-API credentials valid for ``ttl_s``: (username, password)."""
    username = f"{int(now_s) + int(ttl_s)}:{session_id}"
    password = base64.b64encode(hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()).decode()
    return username, password
