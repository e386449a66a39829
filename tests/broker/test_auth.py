"""Token minting/verification and TURN REST credentials."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from broker.auth import (
    authenticate,
    mint_node_credential,
    mint_user_token,
    needs_renewal,
    turn_credentials,
    verify_node_credential,
    verify_user_token,
)
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


def test_rotation_signs_with_the_newest_key_and_verifies_with_any() -> None:
    old, _ = mint_user_token("old", "alice", 0, 60)
    assert verify_user_token(["new", "old"], old, 1) == "alice"  # overlap: the old key still verifies
    with pytest.raises(Unauthorized, match="signature"):
        verify_user_token(["new"], old, 1)  # after removal: refused
    new, _ = mint_user_token(["new", "old"], "bob", 0, 60)
    assert verify_user_token("new", new, 1) == "bob"
    with pytest.raises(Unauthorized, match="signature"):
        verify_user_token("old", new, 1)
    who = authenticate(f"Bearer {old}", admin_token="A", node_token="N", secret=["new", "old"], now_s=1)
    assert (who.name, who.key_index, who.expires_at) == ("alice", 1, 60)


def test_node_credentials_are_bound_to_a_host_and_never_pass_as_user_tokens() -> None:
    cred, exp = mint_node_credential(["k"], "host-a", 100, 3600)
    who = authenticate(f"Bearer {cred}", admin_token="A", node_token="N", secret="k", now_s=101)
    assert (who.role, who.name, who.host, who.expires_at, who.key_index) == (Role.NODE, "host-a", "host-a", exp, 0)
    with pytest.raises(Unauthorized):
        verify_user_token("k", cred, 101)  # same key, other kind: the kind is inside the signed text
    user, _ = mint_user_token("k", "host-a", 100, 60)
    with pytest.raises(Unauthorized):
        verify_node_credential("k", user, 101)
    head, _claims, sig = cred.split(".")
    other = base64.urlsafe_b64encode(b'{"h":"host-b","exp":9999}').rstrip(b"=").decode()
    forged = f"{head}.{other}.{sig}"
    with pytest.raises(Unauthorized, match="signature"):
        verify_node_credential("k", forged, 101)
    with pytest.raises(Unauthorized, match="expired"):
        verify_node_credential("k", cred, exp)
    assert authenticate("Bearer N", admin_token="A", node_token="N", secret="k", now_s=0).host is None


def test_renewal_past_half_life_on_an_old_key_or_for_the_bootstrap_token() -> None:
    ttl = 3600
    fresh = verify_node_credential("k", mint_node_credential("k", "h", 0, ttl)[0], 1)
    assert not needs_renewal(fresh, 1, ttl)
    assert not needs_renewal(fresh, ttl / 2 - 1, ttl)
    assert needs_renewal(fresh, ttl / 2 + 1, ttl)
    rotated = verify_node_credential(["new", "k"], mint_node_credential("k", "h", 0, ttl)[0], 1)
    assert rotated.key_index == 1 and needs_renewal(rotated, 1, ttl)
    assert needs_renewal(authenticate("Bearer N", admin_token="A", node_token="N", secret="k", now_s=0), 0, ttl)
    assert not needs_renewal(authenticate("Bearer A", admin_token="A", node_token="N", secret="k", now_s=0), 0, ttl)
