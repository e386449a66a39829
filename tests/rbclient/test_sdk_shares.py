"""The SDK's share-link calls against a real broker app (in process, real Redis): share, list, watch_view, revoke.

The media side (``rbclient.watch`` decoding the owner's frames) is ``test_sdk_watch_e2e.py``.
"""

from __future__ import annotations

import pytest

from rbclient import ApiError, Broker
from tests.conftest import auth, setup_pool, user_token

pytestmark = pytest.mark.timeout(60)


async def test_share_list_watch_view_and_revoke(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    token = await user_token(api, "u1")
    sid = (await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))).json())["id"]
    url = str(api.make_url("")).rstrip("/")
    async with Broker(url, token=token) as owner:
        link = await owner.share(sid, ttl_s=120)
        assert [(s["id"], s["viewers"]) for s in await owner.shares(sid)] == [(link["id"], 0)]
        async with Broker(url, token=link["token"]) as guest:
            view = await guest.watch_view()
            assert view["id"] == sid and view["role"] == "view"
            assert view["signaling"] == {"url": f"/api/v1/sessions/{sid}/watch", "ice_servers": []}
            assert guest.with_token(view["signaling"]["url"]).endswith(f"/watch?access_token={link['token']}")
            assert (await owner.stop_sharing(sid))["revoked"] == [link["id"]]
            with pytest.raises(ApiError) as refused:
                await guest.watch_view()
            assert (refused.value.status, refused.value.code, refused.value.field) == (403, "share_revoked", "token")
        with pytest.raises(ApiError) as bad:
            await owner.share(sid, ttl_s=5)
        assert (bad.value.status, bad.value.field) == (422, "ttl_s")
