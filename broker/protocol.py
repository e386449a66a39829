"""Wire protocol shared by the broker, the render node (streamer) and the web client.

This module owns every string that crosses a process boundary: session states,
end reasons, signaling message types, data-channel message types and the
Redis pub/sub channel payload kinds.  It is pure data (no I/O, no aiohttp
import) so that ``streamer`` may import it without importing the broker.

The web client keeps a copy of these constants in ``web/protocol.js``; a test
(``tests/web/test_protocol_sync.py``) checks that both agree, so a constant
changed here without the JavaScript side fails the build.

Invariants: values are lowercase snake-case ASCII and never reused for a
different meaning; adding a value is compatible, renaming one is not.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

API_PREFIX: Final = "/api/v1"
# Version of the client protocol that docs/protocol.md describes (REST steps, events, signaling,
# data channels).  Raised by one for every change a client can observe, compatible additions
# included; docs/protocol.md's change log says what changed and whether it breaks old clients.
# tests/web/test_protocol_doc.py checks that the document states this number.
PROTOCOL_VERSION: Final = 8


class SessionState(StrEnum):
    """Lifecycle of a session: queued -> starting -> running <-> disconnected -> ended."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    DISCONNECTED = "disconnected"
    ENDED = "ended"


LIVE_STATES: Final = frozenset(
    {SessionState.QUEUED, SessionState.STARTING, SessionState.RUNNING, SessionState.DISCONNECTED}
)
SEATED_STATES: Final = frozenset({SessionState.STARTING, SessionState.RUNNING, SessionState.DISCONNECTED})


class EndReason(StrEnum):
    """Why a session ended; shown to the user and stored in SQL history."""

    USER = "user"  # the owner ended it
    ADMIN = "admin"  # an admin ended it
    CANCELLED = "cancelled"  # ended while still queued
    QUEUE_TIMEOUT = "queue_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    DISCONNECT_TIMEOUT = "disconnect_timeout"
    MAX_DURATION = "max_duration"
    HOST_LOST = "host_lost"  # the host's heartbeat lease expired
    NODE_ENDED = "node_ended"  # the node ended it (app exited, crash)
    START_FAILED = "start_failed"  # the node could not start it in time
    SCALE_IN = "scale_in"  # force-logoff by the autoscaler after a warning
    STATE_LOST = "state_lost"  # Redis lost the session (restarted empty) and no node re-claimed it


class HostState(StrEnum):
    """A host is ``up`` while its heartbeat lease lives; ``draining`` gets no new sessions."""

    UP = "up"
    DRAINING = "draining"
    DOWN = "down"


class WatchdogCheck(StrEnum):
    """A node watchdog check (``streamer.node.watchdog``): the ``reason`` code of a drain it asks for, and
    what a heartbeat's ``watchdog.tripped`` lists (the broker exports them as a bounded label, ``check``)."""

    GPU_HOT = "gpu_hot"
    GPU_THROTTLED = "gpu_throttled"
    VRAM_LEAK = "vram_leak"
    SESSION_FAILURES = "session_failures"
    ENCODER_ERRORS = "encoder_errors"
    SELFTEST_FAILED = "selftest_failed"
    LOOP_LAG = "loop_lag"


class PlacementStrategy(StrEnum):
    """AVD load-balancing meanings: breadth spreads, depth packs."""

    BREADTH_FIRST = "breadth-first"
    DEPTH_FIRST = "depth-first"


class PoolKind(StrEnum):
    DESKTOP = "desktop"
    GAME = "game"


class Role(StrEnum):
    ADMIN = "admin"
    NODE = "node"
    USER = "user"


# --- signaling (WebSocket /api/v1/sessions/{id}/signal) --------------------------------
class SignalType(StrEnum):
    """Messages relayed between the viewer and the node through the broker."""

    OFFER = "offer"  # viewer -> node: {"type": "offer", "sdp": "..."}
    ANSWER = "answer"  # node -> viewer: {"type": "answer", "sdp": "..."}
    CANDIDATE = "candidate"  # either way: {"type": "candidate", "candidate": "...", "sdpMid": ..., ...}
    BYE = "bye"  # either way: the peer is leaving
    ERROR = "error"  # broker -> either: {"type": "error", "code": ..., "detail": ...}
    PEER_JOINED = "peer_joined"  # broker -> either: the other side connected
    PEER_LEFT = "peer_left"  # broker -> either: the other side disconnected
    # broker -> viewer, then the socket closes: another tab of the user holds the session's viewer;
    # connect again with ?takeover=1 to take it ("continue here?")
    IN_USE = "in_use"
    # broker -> viewer, then the socket closes: another tab took the session over; do not reconnect
    MOVED = "moved"
    # broker -> share viewer: {"type": "control", "granted": true|false}: the owner handed this viewer
    # control (its input is applied from now on) or took it back (its input is dropped again)
    CONTROL = "control"


class ByeReason(StrEnum):
    """``reason`` of a ``bye`` the broker sends a viewer before closing its socket (besides end reasons)."""

    # a share viewer's link was revoked (by the owner or an admin), or every link of the session was:
    # the viewer is disconnected and must not reconnect
    SHARE_REVOKED = "share_revoked"


class ShareRole(StrEnum):
    """What a share link lets its viewer do (``POST /api/v1/sessions/{id}/shares``)."""

    VIEW = "view"  # watch only: the node drops the viewer's input messages


SIGNAL_MAX_BYTES: Final = 64 * 1024  # an SDP with many candidates stays far below this


class SignalError(StrEnum):
    """``code`` of a signaling ``error`` message (``{"type":"error","code":...,"detail":...}``)."""

    BAD_SIGNAL = "bad_signal"  # broker: not a JSON object with a known type
    NOT_RUNNING = "not_running"  # node: the session's runtime is not running (yet); offer again
    BAD_OFFER = "bad_offer"  # node: no sdp, or aiortc refused the offer
    BAD_SDP = "bad_sdp"  # node: the SDP does not parse
    NO_VIDEO = "no_video"  # node: no video section that can receive
    # node: no offered video codec the node can send; the message also lists "offered" and "accepted"
    NO_COMMON_CODEC = "no_common_codec"
    NO_ENCODER = "no_encoder"  # node: no working encoder for the codecs the offer accepts
    BAD_CANDIDATE = "bad_candidate"  # reserved: a malformed candidate is dropped and logged
    ICE_FAILED = "ice_failed"  # node, after an answer: ICE failed (before connecting, or consent lost)
    DTLS_FAILED = "dtls_failed"  # node, after an answer: ICE connected, the DTLS handshake failed
    NO_UDP_PORT = "no_udp_port"  # node: every UDP port of its configured range is in use; offer again later


# --- data channel (viewer <-> node) -------------------------------------------------
INPUT_CHANNEL_LABEL: Final = "input"
# A second, optional channel the viewer opens unordered with maxRetransmits 0: the node's delay
# probes and their answers ("probe" / "pa").  Unreliable on purpose: a lost probe is just lost,
# instead of holding the ones behind it until SCTP retransmits it.
PROBE_CHANNEL_LABEL: Final = "probe"


class InputType(StrEnum):
    """Client -> node input messages (small JSON objects with a ``t`` field)."""

    POINTER_MOVE = "pm"  # {"t":"pm","x":0..1,"y":0..1} relative to the video
    # {"t":"pr","dx":int,"dy":int}: relative motion in the viewer's mouse pixels (pointer lock),
    # |dx|, |dy| <= POINTER_MAX_DELTA; the viewer sums movementX/Y and sends at most one per frame
    POINTER_RELATIVE = "pr"
    POINTER_BUTTON = "pb"  # {"t":"pb","b":1..5,"d":true|false}  b = browser MouseEvent.button + 1
    WHEEL = "pw"  # {"t":"pw","dx":-10..10,"dy":-10..10} in notches
    KEY = "k"  # {"t":"k","c":"KeyA","d":true|false} KeyboardEvent.code
    GAMEPAD = "gp"  # {"t":"gp","i":0..3,"ax":[-1..1]*<=8,"bt":[0..1]*<=17}
    CLIPBOARD = "cb"  # {"t":"cb","text":"..."} <= CLIPBOARD_MAX_CHARS
    # {"t":"tx","text":"é"}: characters to type (a key whose character differs from the remote US layout,
    # an IME or dead-key commit), 1..TEXT_MAX_CHARS printable code points, typed whatever keys are held
    TEXT = "tx"
    RESIZE = "rs"  # {"t":"rs","w":...,"h":...} viewport size in pixels
    PING = "ping"  # {"t":"ping","id":n,"ts":ms} -> node answers "pong"
    # {"t":"pa","id":n,"rx":packets,"rx_ms":ms,"fd":frames}: the answer to a "probe", on
    # PROBE_CHANNEL_LABEL; "fd" (video frames decoded so far) is optional
    PROBE_ACK = "pa"
    # {"t":"vs","g2g":[ms,...]}: viewer stats, every VIEWER_STATS_INTERVAL_MS while it has any: the
    # glass-to-glass latencies (ms) it measured since its last "vs" (frame stamps of the built-in game),
    # at most VIEWER_STATS_MAX_SAMPLES; the node keeps them in a histogram for the operator's metrics
    VIEWER_STATS = "vs"


class NodeEventType(StrEnum):
    """Node -> client messages on the same data channel."""

    PONG = "pong"  # {"t":"pong","id":n,"ts":ms}
    CLIPBOARD = "cb"  # {"t":"cb","text":"..."}
    CURSOR = "cur"  # {"t":"cur","x":0..1,"y":0..1,"visible":bool}
    WARNING = "warn"  # {"t":"warn","code":"ending_soon","detail":"...","ends_in_s":300}
    STATS = "stats"  # {"t":"stats", ...per-session stream stats}
    # {"t":"probe","id":n} on PROBE_CHANNEL_LABEL: the node's delay probe (bitrate control); the
    # viewer answers "pa" at once with the video RTP packets it has received ("rx", inbound-rtp
    # packetsReceived), when it read that count ("rx_ms", its own monotonic clock) and, where it
    # can tell, the frames it decoded ("fd", inbound-rtp framesDecoded)
    PROBE = "probe"


class ControlScheme(StrEnum):
    """``controls`` of a ``stats`` message: what the session's input does, for the viewer to show.

    Absent or null: a desktop or an application the node knows nothing about (show nothing extra).
    """

    BUILTIN_GAME = "builtin_game"  # arrows/WASD/gamepad move, the mouse aims (pointer lock), left click shoots


CLIPBOARD_MAX_CHARS: Final = 65_536
GAMEPAD_MAX_AXES: Final = 8
GAMEPAD_MAX_BUTTONS: Final = 17
GAMEPAD_MAX_INDEX: Final = 3
POINTER_MAX_BUTTON: Final = 5
POINTER_MAX_DELTA: Final = 4096  # px per "pr" message and axis; the viewer clamps, the node refuses more
WHEEL_MAX_NOTCHES: Final = 10
TEXT_MAX_CHARS: Final = 256  # code points per "tx" message; the node also limits characters per second
VIEWER_STATS_MAX_SAMPLES: Final = 64  # glass-to-glass samples per "vs" message; a longer list is dropped
VIEWER_STATS_INTERVAL_MS: Final = 2000  # how often the web client sends "vs" (when it has samples)


# --- node assignment channel (broker -> node, Redis pub/sub relayed over WebSocket) --
class NodeCommand(StrEnum):
    """Commands the broker sends to a node over ``/api/v1/hosts/{id}/commands``."""

    START = "start"  # {"cmd":"start","session":{...}}
    STOP = "stop"  # {"cmd":"stop","session_id":"...","reason":"..."}
    WARN = "warn"  # {"cmd":"warn","session_id":"...","code":"...","detail":"...","ends_in_s":n}
    SIGNAL = "signal"  # {"cmd":"signal","session_id":"...","msg":{...signaling message}}
    # {"cmd":"control","session_id":"...","viewer":"<id>"|null}: the share viewer whose input the node applies
    # (besides the owner's); null: none
    CONTROL = "control"


class StartFailure(StrEnum):
    """Why a session failed to start on its node: the reasons of the heartbeat's
    ``session_start_failures_total`` (node -> broker only; no viewer sees them, so the web client has
    no copy).  A session counts once, at the first of these that happens to it."""

    REFUSED = "refused"  # the node does not run the session's programs (e.g. an app as root)
    DISPLAY = "display"  # the virtual display, its capture or input, or the game renderer failed
    ENCODER = "encoder"  # no encoder could be chosen or opened
    ERROR = "error"  # anything else (a malformed start command, a bug: the node logs the traceback)
    ICE_FAILED = "ice_failed"  # the session's first viewer connection failed ICE (no viewer had connected)
    DTLS_FAILED = "dtls_failed"  # ... or its DTLS handshake (SignalError.ICE_FAILED / DTLS_FAILED)


class EventType(StrEnum):
    """Session event stream (``/api/v1/sessions/{id}/events``) record types."""

    STATE = "state"  # {"type":"state","state":...,"queue_position":n|null,"reason":...}
    WARNING = "warning"  # {"type":"warning","code":...,"detail":...,"ends_in_s":n}


def all_constants() -> dict[str, dict[str, str]]:
    """Every enum in this module by name, for the JavaScript sync test and the OpenAPI document."""
    enums: list[type[StrEnum]] = [
        SessionState,
        EndReason,
        HostState,
        PlacementStrategy,
        PoolKind,
        SignalType,
        SignalError,
        ByeReason,
        ShareRole,
        InputType,
        NodeEventType,
        ControlScheme,
        NodeCommand,
        EventType,
    ]
    return {e.__name__: {m.name: m.value for m in e} for e in enums}
