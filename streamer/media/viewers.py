"""A session's share viewers: view-only peer connections fed from the session's one encode.

Job: ``ShareViewers`` answers the offers of a session's share-link viewers (the broker tags their
signaling with a viewer id), each with its own ``ViewerPeer`` whose video track is a follower of the
session's ``FramePipeline`` (``add_follower``): one encode serves the owner and every viewer.  A
viewer's data-channel messages go to ``ViewOnlyInput``, which answers pings and drops (and counts)
everything else: a view-only viewer never reaches the desktop or the game.

Control (``set_controller``, the broker's ``control`` command): the owner may hand control to one viewer at
a time.  That viewer's keyboard, mouse and gamepad messages go to the session's ``InputRouter`` (the owner's,
so the owner keeps control too and the sink sees one input stream); its resize, clipboard and stats messages
stay dropped (the screen and the clipboard are the owner's).  Taking control back, or the viewer leaving,
releases whatever it held down (the router's ``release_all``).  ``peer_left`` or ``bye``
for a viewer (its socket closed, or its link was revoked) closes its connection.

Re-sent offers: a viewer's page may send the same offer twice (a reconnecting socket).  An offer
whose ICE ufrag and password equal the viewer's current connection's gets the same answer again and
leaves that connection alone; replacing it would leave the page on a connection the node closed.

Bitrate (docs/abr.md, "Several viewers"): the owner's controller decides the encoder's bitrate as
before; with viewers connected it is capped at the lowest viewer's REMB estimate, but never below
``floor_bps`` (the profile's minimum), so one slow viewer cannot starve the owner below a watchable
stream.  Viewers' keyframe requests go through the session's rate limit (one per
``keyframe_min_interval_ms`` for everyone), and followers waiting for a keyframe share one request
(``streamer.media.track``).  Viewers get no sound at this version (their offers' audio sections are
answered inactive).

Concurrency: asyncio on the session's loop; the caller serialises ``signal`` calls (the session's
signal lock).  Each connected viewer has one feedback task polling its peer every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker.protocol import InputType, NodeEventType, SignalType
from streamer.desktop.inputs import InputError, Ping, parse_input
from streamer.media.peer import (
    InputHandler,
    OfferError,
    PeerSettings,
    ViewerPeer,
    candidate_ufrag,
    offer_ice_ufrag,
    parse_offer,
)
from streamer.media.track import FOLLOWER_MAX_QUEUED, EncodedVideoTrack, Follower, FramePipeline

log = logging.getLogger(__name__)

MAX_VIEWERS: Final = 16  # share viewers per session; more are refused with an error
ICE_PWD_RE: Final = re.compile(r"^a=ice-pwd:(\S+)", re.MULTILINE)
# what a viewer in control may send the session: keyboard (keys and typed text), mouse and gamepad (never
# resize nor clipboard)
CONTROL_INPUT: Final = frozenset({InputType.POINTER_MOVE, InputType.POINTER_RELATIVE, InputType.POINTER_BUTTON,
                                  InputType.WHEEL, InputType.KEY, InputType.TEXT, InputType.GAMEPAD})


class ViewOnlyInput:
    """The input handler of a share viewer: pings are answered; keyboard, mouse and gamepad messages go to
    the session's router while ``in_control()`` returns it (the owner handed this viewer control); every
    other message is dropped and counted."""

    def __init__(self, in_control: Callable[[], InputHandler | None] = lambda: None) -> None:
        self.dropped: Counter[str] = Counter()  # by message type ("pm", "k", ... or the parse error's reason)
        self.applied: Counter[str] = Counter()  # by message type, while in control
        self._in_control = in_control

    def handle(self, raw: str | bytes, reply: Callable[[dict[str, Any]], object]) -> None:
        result = parse_input(raw)
        if isinstance(result, Ping):
            ts: float | int = int(result.ts_ms) if result.ts_ms.is_integer() else result.ts_ms
            reply({"t": NodeEventType.PONG.value, "id": result.id, "ts": ts})
            return
        kind = str(result.reason) if isinstance(result, InputError) else str(type(result).TYPE)
        router = self._in_control() if kind in CONTROL_INPUT else None
        if router is None:
            self.dropped[kind] += 1
            return
        self.applied[kind] += 1
        router.handle(raw, reply)

    def release_all(self) -> None:
        """Nothing is ever held for a view-only viewer."""


@dataclass
class ShareViewer:
    id: str
    role: str
    peer: ViewerPeer
    track: EncodedVideoTrack
    follower: Follower
    input: ViewOnlyInput
    pipeline: FramePipeline
    ice: tuple[str | None, str | None]  # the offer's ICE ufrag and password
    answer: str
    connected: bool = False
    remb_bps: int | None = None  # the viewer's latest REMB estimate
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def cap_bitrate(owner_bps: int, estimates: list[int], floor_bps: int) -> int:
    """The encoder's bitrate for an owner's ``owner_bps`` and the viewers' REMB ``estimates``: the slowest
    viewer's estimate, not under ``floor_bps``, never above ``owner_bps`` (pure)."""
    if not estimates:
        return owner_bps
    return min(owner_bps, max(floor_bps, min(estimates)))


def offer_ice(sdp: str) -> tuple[str | None, str | None]:
    m = ICE_PWD_RE.search(sdp)
    return offer_ice_ufrag(sdp), (m.group(1) if m else None)


class ShareViewers:
    """The share viewers of one session (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        settings: PeerSettings,
        *,
        floor_bps: int,
        interval_s: float,
        on_keyframe_request: Callable[[], None],
        on_change: Callable[[], None],
        lock: asyncio.Lock,
        router: Callable[[], InputHandler | None] = lambda: None,
    ) -> None:
        """``lock``: the session's signal lock, held by callers of ``signal``; a lost connection takes it too.
        ``router``: the session's input router (None before the session runs), for the viewer in control."""
        self._sid = session_id
        self._lock = lock
        self._tasks: set[asyncio.Task[None]] = set()
        self._settings = settings
        self._floor_bps = floor_bps
        self._interval_s = interval_s
        self._on_keyframe_request = on_keyframe_request
        self._on_change = on_change  # a viewer connected, left or sent a new estimate: re-cap the encoder
        self._viewers: dict[str, ShareViewer] = {}
        self._early: dict[str, list[Mapping[str, Any]]] = {}
        self.input_dropped = 0  # view-only input dropped, viewers gone included
        self.input_applied = 0  # input of viewers in control applied, viewers gone included
        self.joined = 0
        self._router = router
        self.controller: str | None = None  # the viewer in control (besides the owner), by the broker's word

    def set_controller(self, viewer: str | None) -> None:
        """The broker handed control to ``viewer`` (None: took it back).  The viewer losing control has
        whatever it held down released.  A viewer not connected (yet) is remembered: its offer may follow."""
        if viewer == self.controller:
            return
        previous, self.controller = self.controller, viewer
        log.info("session %s: control %s%s", self._sid, f"handed to viewer {viewer}" if viewer else "taken back",
                 f" from viewer {previous}" if previous else "")
        if previous is not None:
            self._release()

    def _release(self) -> None:
        router = self._router()
        if router is not None:
            router.release_all()

    def _control_of(self, viewer: str) -> Callable[[], InputHandler | None]:
        return lambda: self._router() if self.controller == viewer else None

    def __len__(self) -> int:
        return len(self._viewers)

    async def signal(self, viewer: str, role: str, msg: Mapping[str, Any], pipeline: FramePipeline | None,
                     target_bps: int) -> list[dict[str, Any]]:
        """One signaling message from ``viewer``; returns the replies for it (an answer or an error)."""
        kind = msg.get("type")
        if kind == SignalType.OFFER:
            return await self._offer(viewer, role, msg, pipeline, target_bps)
        if kind == SignalType.CANDIDATE:
            await self._candidate(viewer, msg)
        elif kind in (SignalType.BYE, SignalType.PEER_LEFT):
            await self.drop(viewer, str(msg.get("reason") or kind))
        return []

    async def _offer(self, viewer: str, role: str, msg: Mapping[str, Any], pipeline: FramePipeline | None,
                     target_bps: int) -> list[dict[str, Any]]:
        sdp = msg.get("sdp")
        if pipeline is None:
            return [_error("not_running", f"session {self._sid} is not running")]
        if not isinstance(sdp, str) or not sdp:
            return [_error("bad_offer", "offer without 'sdp'")]
        ice = offer_ice(sdp)
        current = self._viewers.get(viewer)
        if current is not None and ice[0] is not None and current.ice == ice:
            return [{"type": SignalType.ANSWER.value, "sdp": current.answer}]  # the same offer again
        if current is None and len(self._viewers) >= MAX_VIEWERS:
            return [_error("not_running", f"session {self._sid} already has {MAX_VIEWERS} viewers")]
        codec = pipeline.encoder.backend.webrtc_codec
        try:
            offer = parse_offer(sdp)
        except OfferError as exc:
            return [_error(exc.code, exc.detail, **exc.fields)]
        if codec not in offer.video_codecs:
            return [_error("no_common_codec", f"the session is encoded as {codec}; the offer accepts "
                           f"{', '.join(sorted(offer.video_codecs)) or 'nothing we send'}",
                           offered=sorted(offer.video_codecs), accepted=[codec])]
        await self.drop(viewer, "replaced")
        track = EncodedVideoTrack(FOLLOWER_MAX_QUEUED)
        view_input = ViewOnlyInput(self._control_of(viewer))
        peer = ViewerPeer(self._settings, track, view_input, target_bps=target_bps,
                          on_state=lambda p, state: self._state(viewer, p, state),
                          on_channel_open=lambda _p: None, on_keyframe_request=self._on_keyframe_request)
        try:
            answer = await peer.answer(sdp, codec, self._early.pop(viewer, []))
        except Exception as exc:  # boundary: a viewer's SDP must never take the session down
            log.warning("session %s: viewer %s's offer rejected: %r", self._sid, viewer, exc)
            await peer.close()
            return [_error(exc.code if isinstance(exc, OfferError) else "bad_offer", str(exc) or type(exc).__name__)]
        follower = pipeline.add_follower(track)
        v = ShareViewer(viewer, role, peer, track, follower, view_input, pipeline, ice, answer)
        v.task = asyncio.ensure_future(self._feedback(v))
        self._viewers[viewer] = v
        self.joined += 1
        log.info("session %s: share viewer %s (%s) answered with %s", self._sid, viewer, role, peer.codec)
        return [{"type": SignalType.ANSWER.value, "sdp": answer}]

    async def _candidate(self, viewer: str, msg: Mapping[str, Any]) -> None:
        v = self._viewers.get(viewer)
        ufrag = candidate_ufrag(msg)
        if v is None or (ufrag is not None and ufrag != v.peer.remote_ufrag):
            early = self._early.setdefault(viewer, [])
            if len(early) < 64 and len(self._early) <= MAX_VIEWERS * 2:
                early.append(dict(msg))
            return
        try:
            await v.peer.add_candidate(msg)
        except Exception as exc:  # boundary: a malformed candidate is the viewer's problem
            log.info("session %s: viewer %s: bad candidate dropped: %r", self._sid, viewer, exc)

    def _state(self, viewer: str, peer: ViewerPeer, state: str) -> None:
        v = self._viewers.get(viewer)
        if v is None or v.peer is not peer:
            return
        if state == "connected" and not v.connected:
            v.connected = True
            self._on_change()
        elif state in ("failed", "closed"):
            task = asyncio.ensure_future(self._lost(viewer, peer, state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _lost(self, viewer: str, peer: ViewerPeer, state: str) -> None:
        async with self._lock:
            v = self._viewers.get(viewer)
            if v is not None and v.peer is peer:
                await self.drop(viewer, state)

    async def drop(self, viewer: str, why: str) -> None:
        """Close one viewer's connection (idempotent)."""
        self._early.pop(viewer, None)
        if self.controller == viewer and why != "replaced":  # gone: control goes back to the owner alone
            self.controller = None
            self._release()
        v = self._viewers.pop(viewer, None)
        if v is None:
            return
        if v.task is not None and v.task is not asyncio.current_task():
            v.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await v.task
        v.pipeline.remove_follower(v.track)
        self.input_dropped += sum(v.input.dropped.values())
        self.input_applied += sum(v.input.applied.values())
        await v.peer.close()
        log.info("session %s: share viewer %s left (%s); %d input message(s) refused", self._sid, viewer, why,
                 sum(v.input.dropped.values()))
        self._on_change()

    async def close_all(self, why: str) -> None:
        """Close every viewer (teardown; the caller holds the lock, so pending lost-connection tasks,
        which would only close a viewer closed here, are cancelled)."""
        for task in list(self._tasks):
            task.cancel()
        for viewer in list(self._viewers):
            await self.drop(viewer, why)

    def cap_bps(self, bps: int) -> int:
        """The encoder's bitrate with viewers: the owner's ``bps`` capped at the slowest viewer's estimate,
        never below the floor (nor raised above ``bps``)."""
        return cap_bitrate(bps, [v.remb_bps for v in self._viewers.values() if v.connected and v.remb_bps],
                           self._floor_bps)

    def set_target(self, bps: int, frame_interval_ms: float) -> None:
        """Pace every viewer's sender at the encoder's target."""
        for v in self._viewers.values():
            v.peer.set_target(bps, False, frame_interval_ms=frame_interval_ms)

    async def _feedback(self, v: ShareViewer) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                remote = await v.peer.poll_feedback()
            except Exception:  # task boundary: a closing peer
                log.debug("session %s: viewer %s feedback failed", self._sid, v.id, exc_info=True)
                continue
            if remote.remb_bps is not None and remote.remb_bps != v.remb_bps:
                v.remb_bps = remote.remb_bps
                self._on_change()

    @property
    def input_refused(self) -> int:
        """View-only input messages dropped so far, viewers gone included."""
        return self.input_dropped + sum(sum(v.input.dropped.values()) for v in self._viewers.values())

    @property
    def input_granted(self) -> int:
        """Input messages of viewers in control applied so far, viewers gone included."""
        return self.input_applied + sum(sum(v.input.applied.values()) for v in self._viewers.values())

    def stats(self) -> list[dict[str, Any]]:
        return [{"id": v.id, "role": v.role, "connected": v.connected, "remb_bps": v.remb_bps,
                 "frames": v.follower.delivered, "frames_dropped": v.follower.dropped,
                 "in_control": v.id == self.controller, "input_applied": dict(v.input.applied),
                 "input_dropped": dict(v.input.dropped)} for v in self._viewers.values()]


def _error(code: str, detail: str, **fields: Any) -> dict[str, Any]:
    return {"type": SignalType.ERROR.value, "code": code, "detail": detail, **fields}
