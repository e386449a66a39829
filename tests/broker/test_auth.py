"""Token minting/verification and TURN REST credentials."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from broker.auth import authenticate, mint_user_token, turn_credentials, verify_user_token
from broker.errors import Unauthorized
from broker.protocol import Role


def test_user_token_round_trip_and_expiry() -> None:
    tok, exp = mint_user_token("k", "alice", 1000.0, 60)
    assert exp == 1060
    assert verify_user_token("k", tok, 1059.9) == "alice"
    with pytest.raises(Unauthorized, match="expired"):
        verify_user_token("k", tok, 1060)
    with pytest.raises(Unauthorized, match="signature"):
        verify_user_token("other-key", tok, 1000)


@pytest.mark.parametrize("bad", ["", "u1", "u1.a.b", "x.y.z", "u1.!!!.###", "garbage"])
def test_malformed_tokens_are_rejected(bad: str) -> None:
    with pytest.raises(Unauthorized):
        verify_user_token("k", bad, 0)


def test_tampered_claims_fail() -> None:
    tok, _ = mint_user_token("k", "alice", 0, 60)
    head, body, sig = tok.split(".")
    forged_body = base64.urlsafe_b64encode(b'{"u":"admin","exp":99}').rstrip(b"=").decode()
    with pytest.raises(Unauthorized):
        verify_user_token("k", f"{head}.{forged_body}.{sig}", 0)


def test_roles() -> None:
    kw = dict(admin_token="A", node_token="N", secret="k", now_s=0)
    assert authenticate("Bearer A", **kw).role == Role.ADMIN
    assert authenticate("bearer N", **kw).role == Role.NODE
    tok, _ = mint_user_token("k", "bob", 0, 60)
    who = authenticate(f"Bearer {tok}", **kw)
    assert (who.role, who.name) == (Role.USER, "bob")
    for header in (None, "", "Basic A", "Bearer ", "Bearer wrong"):
        with pytest.raises(Unauthorized):
            authenticate(header, **kw)


def test_turn_credentials_follow_coturn_rest_scheme() -> None:
    user, pw = turn_credentials("s3cret", "sess1", 1_700_000_000.5, 3600)
    assert user == "1700003600:sess1"
    want = base64.b64encode(hmac.new(b"s3cret", user.encode(), hashlib.sha1).digest()).decode()
    assert pw == want
