"""Bearer-token authentication: admin and node tokens, HMAC-signed user tokens.

User tokens are ``u1.<base64url(json{"u":user,"exp":epoch_s})>.<base64url(hmac-sha256)>``
signed with the broker secret: any replica verifies them without shared state.
Admin and node tokens are static secrets compared in constant time.

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
from dataclasses import dataclass

from broker.errors import Unauthorized
from broker.protocol import Role

USER_TOKEN_VERSION = "u1"


@dataclass(frozen=True)
class Principal:
    role: Role
    name: str  # user name, "admin" or "node"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_user_token(secret: str, user: str, now_s: float, ttl_s: int) -> tuple[str, int]:
    """A signed token for ``user`` expiring ``ttl_s`` from ``now_s``; returns (token, expiry epoch s)."""
    exp = int(now_s) + int(ttl_s)
    body = _b64(json.dumps({"u": user, "exp": exp}, separators=(",", ":")).encode())
    sig = _b64(hmac.new(secret.encode(), f"{USER_TOKEN_VERSION}.{body}".encode(), hashlib.sha256).digest())
    return f"{USER_TOKEN_VERSION}.{body}.{sig}", exp


def verify_user_token(secret: str, token: str, now_s: float) -> str:
    """The user a token names; raises Unauthorized if it is forged, malformed or expired."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != USER_TOKEN_VERSION:
        raise Unauthorized("malformed token")
    want = hmac.new(secret.encode(), f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    try:
        got = _unb64(parts[2])
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unauthorized("malformed token") from exc
    if not hmac.compare_digest(want, got):
        raise Unauthorized("bad token signature")
    if not isinstance(claims, dict) or not isinstance(claims.get("u"), str) or not isinstance(claims.get("exp"), int):
        raise Unauthorized("malformed token claims")
    if claims["exp"] <= now_s:
        raise Unauthorized("token expired")
    user: str = claims["u"]
    return user


def authenticate(header: str | None, *, admin_token: str, node_token: str, secret: str, now_s: float) -> Principal:
    """Resolve an ``Authorization`` header to a principal or raise Unauthorized."""
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
    return Principal(Role.USER, verify_user_token(secret, token, now_s))


def turn_credentials(secret: str, session_id: str, now_s: float, ttl_s: int) -> tuple[str, str]:
    """coturn REST-API credentials valid for ``ttl_s``: (username, password)."""
    username = f"{int(now_s) + int(ttl_s)}:{session_id}"
    password = base64.b64encode(hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()).decode()
    return username, password
