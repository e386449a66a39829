"""The broker's REST API and session event stream, as a viewer uses them (docs/protocol.md).

Job: ``Broker`` signs in (a guest token, or a token an operator minted), lists pools, creates,
reads, lists and ends sessions, and follows a session's server-sent events; ``wait_seated``
follows the queue with its live position until the session has a seat.  Errors come back as
``ApiError`` carrying the problem body's stable ``code`` and ``field``.

Concurrency: asyncio; one ``aiohttp.ClientSession`` per ``Broker`` (owned unless passed in).
Invariant: the token travels in the ``Authorization`` header, and as ``?access_token=`` only
on the two routes that accept it (events and signaling).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Final
from urllib.parse import quote

import aiohttp

from broker.protocol import API_PREFIX, SEATED_STATES, EventType, SessionState

SessionView = dict[str, Any]
REQUEST_TIMEOUT_S: Final = 30.0  # one REST call; the event stream has none (it is long-lived)


class ApiError(Exception):
    """A problem answer (RFC 9457) from the broker: switch on ``code``, show ``detail``."""

    def __init__(self, status: int, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.detail, self.field = status, code, detail, field


class SessionEnded(Exception):
    """The session ended while the client waited for it; ``view`` is the ended session."""

    def __init__(self, view: SessionView) -> None:
        super().__init__(f"session {view.get('id')} ended: {view.get('end_reason')}")
        self.view = view


async def _raise_for_problem(r: aiohttp.ClientResponse) -> None:
    if r.status < 400:
        return
    try:
        body = await r.json(content_type=None)
    except (json.JSONDecodeError, aiohttp.ContentTypeError, UnicodeDecodeError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    raise ApiError(r.status, str(body.get("code", f"http_{r.status}")), str(body.get("detail", r.reason or "")),
                   body.get("field"))


class Broker:
    """A viewer's view of one broker at ``url`` (``http://host:port``), with a user token."""

    def __init__(self, url: str, token: str | None = None, *, http: aiohttp.ClientSession | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.user: str | None = None
        self.expires_at: int | None = None
        self._http = http
        self._own_http = http is None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._http

    async def close(self) -> None:
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def api_url(self, path: str) -> str:
        """The absolute URL of an API path (``sessions`` or ``/api/v1/sessions``)."""
        return self.url + (path if path.startswith("/") else f"{API_PREFIX}/{path}")

    def with_token(self, path: str) -> str:
        """An absolute URL with ``?access_token=`` (for the event stream and the signaling socket)."""
        sep = "&" if "?" in path else "?"
        return f"{self.api_url(path)}{sep}access_token={quote(self.token or '', safe='')}"

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call; the JSON answer, or ``ApiError``."""
        async with self.http.request(method, self.api_url(path), json=body, headers=self._headers(),
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
            await _raise_for_problem(r)
            return await r.json()

    # --- sign in -----------------------------------------------------------------------
    async def sign_in_guest(self) -> str:
        """``POST /guest``: a one-hour guest token (403 ``forbidden`` when the broker has guests off)."""
        answer = await self.request("POST", "guest")
        self.token, self.user, self.expires_at = answer["token"], answer["user"], answer["expires_at"]
        return str(self.token)

    async def whoami(self) -> dict[str, Any]:
        return dict(await self.request("GET", "whoami"))

    # --- pools and sessions ------------------------------------------------------------
    async def pools(self) -> list[dict[str, Any]]:
        """Every pool with its configuration and live figures."""
        return list((await self.request("GET", "pools"))["pools"])

    async def create_session(self, pool: str, *, width: int | None = None, height: int | None = None,
                             fps: int | None = None, codec: str | None = None) -> SessionView:
        """``POST /sessions``: seated (``starting``) or queued; the user's live one when at the pool's limit."""
        profile = {k: v for k, v in (("width", width), ("height", height), ("fps", fps), ("codec", codec))
                   if v is not None}
        return dict(await self.request("POST", "sessions", {"pool": pool, "profile": profile or None}))

    async def live_sessions(self, pool: str | None = None) -> list[SessionView]:
        """The user's live sessions (resume one rather than create another)."""
        answer = await self.request("GET", "sessions" + (f"?pool={quote(pool)}" if pool else ""))
        return list(answer["sessions"])

    async def session(self, session_id: str) -> SessionView:
        return dict(await self.request("GET", f"sessions/{session_id}"))

    async def end_session(self, session_id: str) -> SessionView:
        """``DELETE /sessions/{id}``: the ended view (again 200 when it had already ended)."""
        return dict(await self.request("DELETE", f"sessions/{session_id}"))

    # --- share links (protocol v6) --------------------------------------------------------
    async def share(self, session_id: str, ttl_s: int = 3600) -> dict[str, Any]:
        """``POST /sessions/{id}/shares``: a view-only link (``token``, ``watch_url``, ``id``, ``expires_at``)."""
        return dict(await self.request("POST", f"sessions/{session_id}/shares", {"role": "view", "ttl_s": ttl_s}))

    async def shares(self, session_id: str) -> list[dict[str, Any]]:
        """The session's live links, each with ``viewers`` connected now."""
        return list((await self.request("GET", f"sessions/{session_id}/shares"))["shares"])

    async def stop_sharing(self, session_id: str, share_id: str | None = None) -> dict[str, Any]:
        """Revoke one link, or every link (``share_id`` None): their viewers are disconnected."""
        path = f"sessions/{session_id}/shares" + (f"/{share_id}" if share_id else "")
        return dict(await self.request("DELETE", path))

    async def give_control(self, session_id: str, viewer: str) -> dict[str, Any]:
        """``POST /sessions/{id}/control``: hand control to one connected viewer (an id from ``shares()``'s
        ``viewer_ids``); its keyboard, mouse and gamepad input is applied besides the owner's."""
        return dict(await self.request("POST", f"sessions/{session_id}/control", {"viewer": viewer}))

    async def take_control(self, session_id: str) -> dict[str, Any]:
        """``DELETE /sessions/{id}/control``: take control back (``previous``: who had it, or None)."""
        return dict(await self.request("DELETE", f"sessions/{session_id}/control"))

    async def watch_view(self) -> SessionView:
        """With a share token as ``token``: the session to watch, as a view ``Stream`` accepts (``id``,
        ``signaling`` with the viewer socket's ``url`` and ``ice_servers``, ``role``).  ``ApiError``
        ``share_revoked`` (403) once the link was revoked."""
        async with self.http.get(f"{self.url}/watch", params={"token": self.token or ""},
                                 headers={"Accept": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
            await _raise_for_problem(r)
            info = await r.json()
        return {"id": info["session"], "role": info["role"], "expires_at": info["expires_at"],
                "signaling": {"url": info["signaling_url"], "ice_servers": info["ice_servers"]}}

    # --- events ------------------------------------------------------------------------
    async def events(self, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """The session's server-sent events as dicts (``{"type": "state", ...view}`` or ``"warning"``).

        Ends after the ``ended`` state event (the broker closes the stream then).
        """
        url = self.with_token(f"sessions/{session_id}/events")
        async with self.http.get(url, headers={"Accept": "text/event-stream"}) as r:
            await _raise_for_problem(r)
            data: list[str] = []
            async for raw in r.content:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith(":"):
                    continue  # keepalive comment
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    event = json.loads("\n".join(data))
                    data = []
                    yield event
                    if event.get("type") == EventType.STATE and event.get("state") == SessionState.ENDED:
                        return

    async def wait_seated(self, session_id: str, on_update: Callable[[SessionView], None] | None = None,
                          *, running: bool = False) -> SessionView:
        """Follow the event stream until the session is seated (or ``running``); ``SessionEnded`` if it ends.

        ``on_update`` sees every state event (``queue_position`` moves while queued).
        """
        want = {SessionState.RUNNING} if running else set(SEATED_STATES)
        while True:
            async for event in self.events(session_id):
                if event.get("type") != EventType.STATE:
                    continue
                view = {k: v for k, v in event.items() if k != "type"}
                if on_update is not None:
                    on_update(view)
                if view.get("state") == SessionState.ENDED:
                    raise SessionEnded(view)
                if view.get("state") in want:
                    return view
            # the stream closed without an ended event (a broker replica restarted): it starts again
            # with the current state, so nothing is missed by reconnecting
