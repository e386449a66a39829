"""The per-session runtime of a render node: display or game, capture, encoder, viewer peer, control.

Job: ``SessionRuntime`` composes one session.  ``start()`` brings up the
picture source (desktop: ``VirtualDisplay`` with the app + ``open_capture`` +
``XInputSink``, and the session's sound: ``streamer.desktop.audio``'s private PulseAudio
whose sink the app plays into, captured into a ``PcmAudioTrack`` for viewers that offer audio;
game: the built-in ``Game`` renderer through ``GameSource``, its sound synthesized in-process
(``streamer.desktop.gamesound``: blips on game events, no audio server),
or a game command on a virtual display like a desktop), probes and selects an
encoder (``streamer.abr.control.choose_backend``) and starts the frame thread
(``streamer.media.track.FramePipeline``).  ``handle_signal`` answers viewer offers
(``streamer.media.peer.ViewerPeer``); a new offer replaces the previous viewer while
display and encoder keep running (the new viewer's first frame is a keyframe).
While a viewer is attached, a control loop reads its RTCP feedback every
``stats_interval_ms`` and applies ``streamer.abr.control.StreamController``'s
decisions: a new target bitrate -> ``VideoEncoder.set_bitrate`` (live), a new
ladder rung -> a new encoder at that size/fps (one keyframe), installed by the
frame thread between frames.  Every control step is kept as telemetry
(``stats()["decisions"]``: the newest ``DECISION_LOG_SIZE`` records of target,
reasons, rung and signals; ``stats()["decision_counts"]``: steps per reason).
Desktops also send the viewer their clipboard (``streamer.desktop.clipboard.ClipboardBridge``) and
follow the viewer's window (``rs``): ``streamer.abr.viewport`` fits the size, RandR sets it, a capture of
the new size replaces the old one (never grabbing outside the screen) and the ladder is rebuilt on it
(a new encoder, one keyframe).
``stop()`` tears everything down.

Events (``on_event(name, info)``, delivered in order from one task):
- ``"connected"``: a viewer's connection reached ``connected``;
- ``"disconnected"``: that viewer went away (bye, peer_left, failed/closed,
  or replaced by a new offer) and the session keeps running;
- ``"signal"``: ``{"msg": {...}}``, a signaling message for the viewer that answers nothing it
  sent (today: an ``error`` ``ice_failed``/``dtls_failed`` when its connection failed); with
  ``"start_failure": code`` the first time a connection fails before any viewer of the session
  connected (the node counts it as the session's start failure);
- ``"ended"``: the runtime ended *by itself* (the app exited, the frame
  pipeline failed); it also stops itself.  ``stop()`` called by the owner
  emits nothing, and no event is emitted once stopping has begun.

Concurrency model: one asyncio loop owns the runtime; signaling is serialized
by a lock.  CPU-bound and blocking work never runs on the loop: grab + encode
on the frame thread (``rb-frames-<id>``), X input injection on one input
thread (``rb-input-<id>``), encoder opening, probing, capture open/close and
thread joins through ``asyncio.to_thread``.  Game input is queued to the
frame thread, which owns the ``Game``.

Invariants:
- after ``stop()`` (or a failed ``start()``) no thread, process, display or
  encoder of the session is left;
- policies are pure and get time as ``now_ms`` (a monotonic clock read here);
- only the codec the encoder produces is in the answer;
- a viewer's malformed messages are counted and dropped; a bad offer is
  answered with an ``error`` message, never an exception.

Size: about 1,160 lines on purpose: the start and stop order of one session (display, capture, encoder,
frame thread, peer, control loop) is read in one place to check that every error path tears down what
was started; the parts it composes live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, cast

from aiortc.rtp import RtcpReceiverInfo

from broker.protocol import ControlScheme, NodeEventType, PoolKind, SignalType
from encoder import (
    AIORTC_VIDEO_CODECS,
    Backend,
    EncoderConfig,
    NoEncoderError,
    ProbeResult,
    VideoEncoder,
    probe_all_async,
)
from rbcommon.udpports import PortRange
from streamer.abr import bitrate as bitrate_policy
from streamer.abr import ladder as ladder_policy
from streamer.abr import playout as playout_policy
from streamer.abr import viewport as viewport_policy
from streamer.abr.bitrate import DESKTOP_PROFILE, GAME_PROFILE, BitrateProfile, Feedback
from streamer.abr.control import (
    CODEC_PREFERENCES,
    RATE_MATCH_WINDOW_MS,
    SENDABLE_BACKENDS,
    ControlStep,
    StreamController,
    choose_backend,
    round2,
)
from streamer.abr.ladder import Rung
from streamer.desktop.audio import AudioCapture, AudioError, AudioServer, audio_available
from streamer.desktop.capture import FrameSource, GameRendererUnavailable, open_capture
from streamer.desktop.clipboard import ClipboardBridge
from streamer.desktop.display import DisplayConfig, VirtualDisplay, app_env, gpu_render_env
from streamer.desktop.game import Game
from streamer.desktop.gamesound import GameSynth, SynthFramer
from streamer.desktop.inputsink import GameSource, InputRouter, XInputSink, wall_clock_ms
from streamer.desktop.pcm import PcmFramer
from streamer.desktop.sessionuser import SessionUser
from streamer.desktop.uinput import PadSet
from streamer.media.audiotrack import PcmAudioTrack
from streamer.media.glass import GlassHistogram
from streamer.media.peer import (
    EARLY_CANDIDATES_MAX,
    OfferError,
    PeerSettings,
    PlayoutDelay,
    RemoteFeedback,
    ViewerPeer,
    candidate_ufrag,
    parse_offer,
    rtc_configuration,
)
from streamer.media.probe import PROBE_INTERVAL_MS, RecvWindow, SendLog
from streamer.media.track import EncodedVideoTrack, FramePipeline
from streamer.media.viewers import ShareViewers

log = logging.getLogger(__name__)

KINDS: Final = frozenset({PoolKind.DESKTOP.value, PoolKind.GAME.value})
CAPTURE_BACKENDS: Final = frozenset({"auto", "x11grab", "mss"})
GAME_RENDERERS: Final = frozenset({"auto", "cpu", "gl"})
MAX_WIDTH_PX: Final = 7680
MAX_HEIGHT_PX: Final = 4320
MIN_SIZE_PX: Final = 64
MAX_GPUS: Final = 64  # GPU indexes 0..63, as the broker's host schema allows
EVENT_DRAIN_TIMEOUT_S: Final = 10.0  # stop() waits this long for queued events to be delivered
# the send rate the controller gets is averaged over this long: the window its rate match divides by
SEND_RATE_WINDOW_S: Final = RATE_MATCH_WINDOW_MS / 1000
# Retransmissions are paid for out of the encoder's bits (libwebrtc's "protection bitrate"), so
# media + retransmissions stay at the target; but they never take more than half of it.
MIN_MEDIA_PERCENT: Final = 50
RTX_PACKET_BYTES: Final = 1_200  # assumed size of a retransmitted packet before any was sent
LOSS_MIN_PACKETS: Final = 50  # receiver-report loss is judged over at least this many packets
SOURCE_SWITCH_TIMEOUT_S: Final = 5.0  # a frame in progress (grab + encode) ends well within this
DECISION_LOG_SIZE: Final = 100  # control steps kept in stats()["decisions"] (10 s at 100 ms)

EventCallback = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class SessionSpec:
    """What to run: from the broker's start command and the node's settings."""

    id: str
    kind: str  # "desktop" | "game"
    width: int
    height: int
    fps: int
    codec: str = "auto"  # auto | h264 | vp8: the profile's codec preference
    ice_servers: tuple[dict[str, Any], ...] = ()  # [{"urls": [...], "username": ..., "credential": ...}]
    app_command: tuple[str, ...] = ("xterm",)  # desktop app
    game_command: tuple[str, ...] = ()  # empty: the built-in game renderer
    gpu: int | None = None  # GPU (NVML index) the broker seated it on; None: a CPU-encode host's pseudo-GPU

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("session id must not be empty")
        if self.gpu is not None and not 0 <= self.gpu < MAX_GPUS:
            raise ValueError(f"gpu must be within 0..{MAX_GPUS - 1}, got {self.gpu}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if not (MIN_SIZE_PX <= self.width <= MAX_WIDTH_PX and MIN_SIZE_PX <= self.height <= MAX_HEIGHT_PX):
            raise ValueError(f"size {self.width}x{self.height} outside {MIN_SIZE_PX}..{MAX_WIDTH_PX}x{MAX_HEIGHT_PX}")
        if self.width % 2 or self.height % 2:
            raise ValueError(f"size must be even (4:2:0 video), got {self.width}x{self.height}")
        if not 1 <= self.fps <= 240:
            raise ValueError(f"fps must be within 1..240, got {self.fps}")
        if self.codec.lower() not in CODEC_PREFERENCES:
            raise ValueError(f"codec must be one of {sorted(CODEC_PREFERENCES)}, got {self.codec!r}")


@dataclass(frozen=True)
class RuntimeConfig:
    """Node-wide settings every session runtime shares."""

    advertise_addresses: tuple[str, ...] = ()  # host candidates to offer; empty: aioice's interface list
    encoder_preference: str = "auto"  # auto, a backend name (libx264, h264_nvenc) or a codec
    capture_backend: str = "auto"  # auto | x11grab | mss
    # The host has an NVIDIA driver (NVML found its GPUs): a session's apps render on its GPU with
    # NVIDIA's GLX and its hardware encoder opens there.  False on CPU-encode hosts.
    gpu_render: bool = False
    # The built-in game's renderer: "auto" = OpenGL (EGL) on the session's GPU on a GPU host, numpy
    # elsewhere, falling back to numpy when GL cannot start; "gl" = OpenGL or the start fails; "cpu".
    game_renderer: str = "auto"
    bitrate_profile: BitrateProfile | None = None  # None: streamer.abr.bitrate's desktop/game profile by kind
    # feedback -> bitrate/ladder decision period.  100, not 200: a ramp's overshoot shows in the
    # probes a period sooner (ABR lab: at 200 ms the second high probe came with the queue at
    # 60-90 ms of the bottleneck's 100, and the cut landed after the overflow)
    stats_interval_ms: int = 100
    client_stats_interval_ms: int = 1000  # stats event to the viewer
    keyframe_min_interval_ms: int = 250  # PLI/FIR storms are answered at most this often
    # The viewer's probe answers show its picture frozen (packets arrive, no frame decodes) this
    # long: send a keyframe without waiting for its own request (Chromium asks after 3 s);
    # again at most once per stall_keyframe_interval_ms while the stall lasts.  0: never.
    # 500 ms, not 1 s: after a capacity drop the first such keyframe can be lost in the same
    # overflow (ABR lab, 8 -> 2 Mbps: a second 0.8 s freeze followed the first).
    stall_keyframe_ms: int = 300
    stall_keyframe_interval_ms: int = 500
    # The RTP playout-delay extension to viewers that offer it (streamer.media.peer): min = max = 0 = show
    # each frame once decoded, no jitter-buffer wait (bench_glass 720p60: see docs/benchmarks.md); the
    # maximum is relaxed while the viewer's jitter needs a buffer (streamer.abr.playout), and the viewer
    # then raises its own floor (web/playout.js).  False: not sent (the viewer buffers as it likes).
    playout_delay: bool = True
    # The account a session's programs (desktop WM and app, a game command, the session's PulseAudio) run as:
    # streamer.desktop.sessionuser.  None: the node's own.
    session_user: SessionUser | None = None
    # ICE host candidates bind UDP ports of this range (a firewall's, a hostPort range); None: any port
    udp_ports: PortRange | None = None
    # Why this node must not start session programs (a root session user the operator did not allow), or
    # None.  A desktop or game-command session then fails to start with this reason; the built-in game runs.
    app_refusal: str | None = None
    # Sound: a desktop session's own PulseAudio captured as Opus, the built-in game's synthesized blips.
    # False: every session is silent (no audio server started, no audio track offered).
    audio: bool = True
    # The built-in game beeps (1 kHz, 60 ms) at every multiple of this many ms of its render clock, the
    # instant the frame stamped with it is rendered: how bench/bench_avsync.py measures A/V sync.  0: off.
    game_beacon_ms: int = 0
    # Desktop screens follow the viewer's window ("rs", streamer.abr.viewport): at most this many
    # pixels (or the start profile's, if more) and this long a side (the Xvfb framebuffer is this
    # square).  resize_max_side 0: the screen keeps its start size.
    resize_max_pixels: int = viewport_policy.DEFAULT_MAX_PIXELS
    resize_max_side: int = viewport_policy.DEFAULT_MAX_SIDE_PX
    # The remote clipboard reaches the viewer (streamer.desktop.clipboard): CLIPBOARD, plus PRIMARY
    # (text selected with the mouse) when true.
    clipboard_primary: bool = False
    # Desktop sessions get virtual gamepads (streamer.desktop.uinput) for the viewer's pads: the node probed
    # /dev/uinput at start.  False: desktop gamepad input is dropped (the node logged why once).
    gamepad: bool = False

    def __post_init__(self) -> None:
        if self.capture_backend not in CAPTURE_BACKENDS:
            raise ValueError(f"capture_backend must be one of {sorted(CAPTURE_BACKENDS)}")
        if self.game_renderer not in GAME_RENDERERS:
            raise ValueError(f"game_renderer must be one of {sorted(GAME_RENDERERS)}")
        if self.stats_interval_ms < 10 or self.client_stats_interval_ms < self.stats_interval_ms:
            raise ValueError("stats_interval_ms must be >= 10 and <= client_stats_interval_ms")
        if self.game_beacon_ms < 0:
            raise ValueError("game_beacon_ms must be >= 0")
        if self.keyframe_min_interval_ms < 0:
            raise ValueError("keyframe_min_interval_ms must be >= 0")
        if self.stall_keyframe_ms < 0 or self.stall_keyframe_interval_ms < 0:
            raise ValueError("stall_keyframe_ms and stall_keyframe_interval_ms must be >= 0")
        if self.resize_max_side:
            viewport_policy.ViewportLimits(self.resize_max_pixels, self.resize_max_side)  # raises when out of range


class SessionRefused(Exception):
    """This node does not start the session's programs (``RuntimeConfig.app_refusal`` says why)."""


# --- helpers ---------------------------------------------------------------------------


def media_bps(encoder_bps: int, retransmit_bps: int) -> int:
    """The encoder's bitrate once the retransmission rate is paid for (never under MIN_MEDIA_PERCENT)."""
    return max(encoder_bps - retransmit_bps, encoder_bps * MIN_MEDIA_PERCENT // 100)


class LossWindow:
    """Loss over at least ``LOSS_MIN_PACKETS`` expected packets, from receiver reports' cumulative counts.

    A report's own fraction lost covers the span since the viewer's previous report, which
    Chromium makes tiny: it sends a report with every NACK, so on a path with 2 % random loss
    most reports covered a few packets and said 33-50 % lost (measured, bench_abr (c)), and
    each was a loss cut.  Like libwebrtc's loss-based estimator, the loss is taken over enough
    packets instead: (lost since the reference) / (sequence numbers since it), in RTCP's x256.
    """

    def __init__(self) -> None:
        self._ref: tuple[int, int] | None = None  # (extended highest sequence, cumulative lost)

    def fraction_lost(self, report: RtcpReceiverInfo | None) -> int | None:
        """The x256 loss since the reference once ``LOSS_MIN_PACKETS`` were expected, else None."""
        if report is None:
            return None
        if self._ref is None or report.highest_sequence < self._ref[0]:  # first report, or a new stream
            self._ref = (report.highest_sequence, report.packets_lost)
            return None
        expected = report.highest_sequence - self._ref[0]
        if expected < LOSS_MIN_PACKETS:
            return None
        lost = report.packets_lost - self._ref[1]
        self._ref = (report.highest_sequence, report.packets_lost)
        scale = bitrate_policy.FRACTION_LOST_SCALE
        return max(0, min(scale - 1, lost * scale // expected))


def feedback_from_remote(
    remote: RemoteFeedback,
    send_rate_bps: int | None,
    packet_bytes: float | None = None,
    fraction_lost: int | None = None,
    sent_log: SendLog | None = None,
    probe_rtt_ms: float | None = None,
    node_jitter_ms: float = 0.0,
) -> Feedback:
    """The bitrate policy's input from one poll of the viewer's feedback.

    ``packet_bytes``: the mean RTP payload per packet we sent lately; it turns the viewer's
    receive rate in packets (its probe answers) into bits per second.  ``fraction_lost``: the
    loss over enough packets (``LossWindow``), used instead of the report's own.  ``sent_log``
    (packets sent, media and retransmissions) and ``probe_rtt_ms`` (the latest probe round trip)
    give what we sent over the viewer's receive window (``matched_send_bps``).  ``node_jitter_ms``:
    the node's own share of the viewer's jitter (``EncodedVideoTrack.send_jitter_ms``), taken out of
    the report's jitter (a delay signal in RTCP mode: encode times that vary are no queue).
    """
    report = remote.report
    recv_pps = remote.probe.recv_pps
    recv_bps = round(recv_pps * packet_bytes * 8) if recv_pps is not None and packet_bytes else None
    return Feedback(
        remb_bps=remote.remb_bps,
        fraction_lost=fraction_lost,
        cumulative_lost=report.packets_lost if report is not None else None,
        jitter_ms=(
            playout_policy.path_jitter_ms(bitrate_policy.jitter_ms_from_rtp(report.jitter), node_jitter_ms)
            if report is not None
            else None
        ),
        rtt_ms=remote.rtt_ms,
        send_rate_bps=send_rate_bps,
        probe_rtt_ms=remote.probe.rtt_ms,
        recv_rate_bps=recv_bps,
        sent_matched_bps=matched_send_bps(remote.probe.window, sent_log, packet_bytes, probe_rtt_ms),
    )


def matched_send_bps(
    window: RecvWindow | None, sent_log: SendLog | None, packet_bytes: float | None, probe_rtt_ms: float | None
) -> int | None:
    """What we sent over the span the viewer's receive rate covers (bits per second), or None.

    The viewer counted its window's packets up to one round trip, and the wait for the next probe
    (half a probe interval on average), before the answers carrying the counts arrived here; the
    packets were sent over the same span that much earlier.
    """
    if window is None or sent_log is None or not packet_bytes or probe_rtt_ms is None:
        return None
    span_ms = window.last_arrived_ms - window.first_arrived_ms
    if span_ms <= 0:
        return None
    lag_ms = probe_rtt_ms + PROBE_INTERVAL_MS / 2
    packets = sent_log.between(window.first_arrived_ms - lag_ms, window.last_arrived_ms - lag_ms)
    return None if packets is None else round(packets * 1000 / span_ms * packet_bytes * 8)


# --- the runtime -------------------------------------------------------------------------


class SessionRuntime:
    """One session on this node (see the module docstring)."""

    def __init__(
        self,
        spec: SessionSpec,
        config: RuntimeConfig,
        *,
        on_event: EventCallback | None = None,
        game_factory: Callable[[int, int], Game] = Game,
    ) -> None:
        """``game_factory(width, height)`` makes the built-in game renderer (benchmarks pass a busier scene)."""
        self.spec = spec
        self.config = config
        self._on_event = on_event
        self._game_factory = game_factory
        self._state = "new"  # new -> starting -> running -> stopping -> stopped
        self._running = asyncio.Event()
        kind_game = spec.kind == PoolKind.GAME.value
        self._profile = config.bitrate_profile or (GAME_PROFILE if kind_game else DESKTOP_PROFILE)
        make_ladder = ladder_policy.game_ladder if kind_game else ladder_policy.desktop_ladder
        self._ladder = make_ladder(spec.width, spec.height, spec.fps)
        self._display: VirtualDisplay | None = None
        self._audio: AudioServer | None = None  # desktop sessions' private PulseAudio (None: silent)
        self._audio_capture: AudioCapture | None = None
        # the built-in game's sound (None: another kind, a game command, or audio off on this node)
        self._game_synth = (GameSynth(config.game_beacon_ms)
                            if kind_game and not spec.game_command and config.audio else None)
        self._source: FrameSource | None = None
        self._sink: XInputSink | GameSource | None = None
        self._router: InputRouter | None = None
        self._pipeline: FramePipeline | None = None
        self._probes: tuple[ProbeResult, ...] = ()
        self._selection_reasons: tuple[str, ...] = ()
        self._peer: ViewerPeer | None = None
        self._track: EncodedVideoTrack | None = None
        self._controller: StreamController | None = None
        self._control_task: asyncio.Task[None] | None = None
        self._connected = False
        self._viewers = 0
        self._signal_lock = asyncio.Lock()
        # candidate messages trickled before the offer they belong to (signaling): applied by the next offer
        self._early_candidates: list[Mapping[str, Any]] = []
        self._tasks: set[asyncio.Task[Any]] = set()  # cancelled on teardown: control loop, app watch
        self._peer_tasks: set[asyncio.Task[Any]] = set()  # awaited on teardown: closing a lost viewer
        self._self_stop: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        self._event_task: asyncio.Task[None] | None = None
        self._pending_warning: dict[str, Any] | None = None
        self._last_keyframe_s = 0.0  # monotonic seconds of the last keyframe request we passed on
        self._keyframe_timer: asyncio.TimerHandle | None = None
        self._remote: dict[str, Any] = {"rtt_ms": None, "jitter_ms": None, "loss": None, "remb_bps": None}
        self._send_rate_bps: int | None = None
        self._encoder_bps: int | None = None  # last bitrate given to the encoder (target x gain - retransmissions)
        self._retransmit_bps = 0  # retransmission rate over the send-rate window
        self._keyframe_requests = 0
        self._stall_keyframes = 0
        self._viewer_freezes = 0  # freezes earlier viewers' probe answers showed (the current one's: its peer)
        self._encoder_open_errors = 0  # encoders that failed to open for a new rung or codec
        self._first_offer_ms: float | None = None  # monotonic ms the first viewer's offer was answered
        self._first_frame_ms: float | None = None  # that offer -> the viewer's first decoded frame, ms
        self._glass = GlassHistogram()  # glass-to-glass samples the viewers sent ("vs"), every viewer's
        self._start_failure_sent = False  # a failed first connection was reported as the start failure
        self._stall_keyframe_s: float | None = None  # monotonic seconds of the last one
        self._playout: playout_policy.PlayoutDecision | None = None  # the current viewer's, once decided
        # Telemetry of every control step (all viewers of the session): the newest records and
        # a count per bitrate reason since the session started.
        self._decisions: deque[dict[str, Any]] = deque(maxlen=DECISION_LOG_SIZE)
        self._decision_counts: Counter[str] = Counter()
        self._start_task: asyncio.Task[Any] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        # Clipboard and resize (desktop sessions): the remote clipboard -> the viewer; the screen size
        # wanted and the task that sets it.
        self._clipboard: ClipboardBridge | None = None
        self._viewport: viewport_policy.ViewportLimits | None = None
        self._want_size: tuple[int, int] | None = None
        self._resize_task: asyncio.Task[None] | None = None
        self._encoder_lock = asyncio.Lock()  # one encoder change at a time (ladder steps, resizes)
        # share-link viewers: view-only peers fed from the same encode; they cap the encoder's bitrate
        self._share = ShareViewers(
            spec.id,
            PeerSettings(ice_servers=spec.ice_servers, advertise_addresses=config.advertise_addresses,
                         playout_delay=config.playout_delay, udp_ports=config.udp_ports),
            floor_bps=self._profile.min_bps, interval_s=config.stats_interval_ms / 1000.0,
            on_keyframe_request=self._keyframe_requested, on_change=self._share_changed, lock=self._signal_lock,
            router=lambda: self._router,
        )
        self._owner_encoder_bps: int | None = None  # the owner's controller's encoder bitrate, before the viewers' cap
        self.resizes = 0  # screen resizes applied

    # -- public API ----------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def last_input_ms(self) -> int | None:
        """When the viewer last sent user input (ms since the epoch); None if never."""
        return self._router.last_input_ms if self._router is not None else None

    @property
    def display_name(self) -> str | None:
        """The X display (``":3"``) of desktop sessions, else None."""
        return self._display.name if self._display is not None else None

    @property
    def pids(self) -> dict[str, int]:
        """Pids of the session's processes by role (xvfb, wm, app; audio and audio_capture with sound)."""
        pids = dict(self._display.pids) if self._display is not None else {}
        for role, child in (("audio", self._audio), ("audio_capture", self._audio_capture)):
            pid = child.pid if child is not None else None
            if pid is not None:
                pids[role] = pid
        return pids

    @property
    def thread_names(self) -> tuple[str, ...]:
        """Name prefixes of the threads this session starts."""
        return (f"rb-frames-{self.spec.id}", f"rb-input-{self.spec.id}", f"rb-clip-{self.spec.id}")

    async def start(self) -> None:
        """Bring up source, capture, input and encoder.  On failure (or cancellation) clean up and raise."""
        if self._state != "new":
            raise RuntimeError(f"start() on a runtime that is {self._state}")
        self._state = "starting"
        self._start_task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        try:
            await self._start()
        except BaseException:
            await self._teardown()
            self._state = "stopped"
            raise
        finally:
            self._start_task = None  # the caller's task: never cancel it once start() returned
        if self._state == "starting":
            self._state = "running"
            self._running.set()

    async def handle_signal(self, msg: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Apply one signaling message from the viewer; returns the messages to send back."""
        kind = msg.get("type")
        async with self._signal_lock:
            if kind == SignalType.OFFER:
                return await self._on_offer(msg)
            if kind == SignalType.CANDIDATE:
                await self._on_candidate(msg)
            elif kind in (SignalType.BYE, SignalType.PEER_LEFT):
                self._early_candidates.clear()  # the viewer left: its next offer brings its own
                await self._drop_peer(str(kind))
            elif kind == SignalType.ERROR:
                log.warning("session %s: signaling error from the broker: %s", self.spec.id, dict(msg))
            elif kind != SignalType.PEER_JOINED:
                log.info("session %s: ignoring signaling message of type %r", self.spec.id, kind)
        return []

    async def handle_viewer_signal(self, viewer: str, role: str, msg: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A share viewer's signaling message (``streamer.media.viewers``); the owner's viewer is untouched."""
        async with self._signal_lock:
            pipeline = self._pipeline if self._state == "running" else None
            return await self._share.signal(viewer, role, msg, pipeline, self._encoder_bps or self._profile.start_bps)

    def set_controller(self, viewer: str | None) -> None:
        """The share viewer whose keyboard, mouse and gamepad input is applied besides the owner's (None: none)."""
        self._share.set_controller(viewer)

    async def warn(self, code: str, detail: str, ends_in_s: int) -> None:
        """Tell the viewer (now, or when it next connects) that the session is about to end."""
        payload = {"t": NodeEventType.WARNING.value, "code": code, "detail": detail, "ends_in_s": int(ends_in_s)}
        self._pending_warning = payload
        if self._peer is not None:
            self._peer.send_event(payload)

    def stats(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the stream (see the keys below; None where unknown)."""
        pipeline = self._pipeline
        router = self._router
        step = self._controller.last if self._controller is not None else None
        out: dict[str, Any] = {
            "session_id": self.spec.id,
            "kind": self.spec.kind,
            "state": self._state,
            "connected": self._connected,
            "viewers": self._viewers,  # viewers that have connected so far
            # share-link viewers now: id, role, connected, remb_bps, frames, frames_dropped, input_dropped by type
            "share_viewers": self._share.stats(),
            "share_viewers_joined": self._share.joined,  # share viewers answered so far
            "share_input_dropped": self._share.input_refused,  # view-only input messages refused so far
            "share_input_applied": self._share.input_granted,  # input of viewers in control applied so far
            "share_controller": self._share.controller,  # the viewer in control besides the owner, or None
            "fps": None,
            "target_fps": None,
            "frames": 0,
            "encode_ms": None,  # median conversion + encode per frame, ms
            "encode_ms_p95": None,
            "convert_ms": None,
            "grab_ms": None,  # median capture/render per frame, ms
            "source": self._source.backend if self._source is not None else None,  # x11grab | mss | game | game-gl
            "gpu": self.spec.gpu if self._on_gpu() else None,  # the GPU this session renders/encodes on
            "bitrate_bps": self._send_rate_bps,  # measured RTP payload rate, retransmissions included
            "target_bps": step.bitrate.target_bps if step else None,
            # what the encoder was asked for: target x rate-match gain - the retransmission rate
            "encoder_bps": self._encoder_bps,
            "retransmit_bps": self._retransmit_bps,  # retransmitted RTP payload (estimated at the mean packet size)
            "encoder_bitrate_bps": None,  # what the codec runs at (may hold back small changes)
            "keyframes": 0,  # produced by the current encoder
            "requested_keyframes": 0,  # keyframes forced by PLI/FIR or a new viewer (current encoder)
            "bitrate_keyframes": 0,  # keyframes caused by bitrate changes the codec could not follow live
            "keyframe_requests": self._keyframe_requests,  # PLI/FIR received
            "stall_keyframes": self._stall_keyframes,  # sent because the viewer's picture froze (probes)
            # freezes (streamer.media.freezes): the larger of the frame thread's send gaps and the
            # viewers' decoded-frame standstills (a send gap shows on the viewer too: never summed)
            "freezes": self._viewer_freezes + (self._peer.viewer_freezes if self._peer is not None else 0),
            "encoder_errors": self._encoder_open_errors,  # frames the encoder raised on + encoders that failed to open
            # the first offer answered -> the first frame a viewer decoded (probe answers' "fd"), ms; None: unknown
            "first_frame_ms": self._first_frame(),
            # the viewers' glass-to-glass samples (streamer.media.glass's wire form); None before the first
            "glass_to_glass_ms": self._glass.snapshot(),
            "glass_samples_ignored": self._glass.ignored,
            # NACKed packets of the current viewer: retransmitted, skipped as repeated within an RTT
            # or over the retransmission budget (streamer.media.rtx)
            "retransmits": asdict(self._peer.retransmits) if self._peer is not None else None,
            # the send pacer (streamer.media.pacer): packets released, their wait, releases drained faster
            "pacer": asdict(pacer) if self._peer is not None and (pacer := self._peer.pacer) is not None else None,
            "encoder": None,
            "codec": None,
            "audio_codec": self._peer.audio_codec if self._peer is not None else None,  # "opus": the viewer hears it
            "candidate": self._peer.candidate_type() if self._peer is not None else None,  # host | srflx | relay
            "width": None,
            "height": None,
            "skipped_backpressure": 0,
            "skipped_late": 0,
            "last_input_ms": self.last_input_ms,
            "input_accepted": router.accepted if router else 0,
            "input_dropped": router.dropped if router else 0,
            "input": router.counters.snapshot() if router else {"accepted": {}, "dropped": {}},
            "bitrate_reason": step.bitrate.reason.value if step else None,
            "ladder_reason": step.ladder.reason.value if step else None,
            # the viewer's answers to delay probes (None: it answers none): the period's lowest
            # round trip, and the rate it receives video at
            "probe_rtt_ms": round2(step.bitrate.signals.probe_rtt_ms) if step else None,
            "recv_rate_bps": step.bitrate.signals.recv_rate_bps if step else None,
            # the frame thread's wall time per frame over the frame interval (1+: frames start late);
            # the ladder's CPU input, never the bitrate's
            "frame_load": round2(step.frame_load) if step else None,
            "encoder_reasons": list(self._selection_reasons),
            # the RTP playout-delay range the viewer's packets carry ([min, max] ms; None: not sent)
            "playout_delay_ms": self._playout_range(),
            # RFC 3550 jitter (ms) of render-to-send times: the node's share of the viewer's jitter
            "send_jitter_ms": round(self._send_jitter_ms(), 2),
            # newest control steps, oldest first: ControlStep.record() (target, reasons, rung, signals)
            "decisions": list(self._decisions),
            "decision_counts": dict(self._decision_counts),  # control steps per bitrate reason
            **self._remote,  # rtt_ms, jitter_ms, loss (0..1), remb_bps
        }
        if pipeline is not None:
            p = pipeline.stats()
            encoder = pipeline.encoder
            snap = encoder.stats.snapshot()
            out.update(
                fps=round(p.fps, 2),
                target_fps=p.target_fps,
                frames=p.frames,
                encode_ms=round(snap.total_ms_p50, 3),
                encode_ms_p95=round(snap.total_ms_p95, 3),
                convert_ms=round(snap.convert_ms_p50, 3),
                encoder_bitrate_bps=encoder.bitrate_bps,
                keyframes=snap.keyframes,
                requested_keyframes=snap.requested_keyframes,
                bitrate_keyframes=snap.bitrate_keyframes,
                encoder=p.encoder,
                codec=encoder.backend.webrtc_codec,
                width=p.width,
                height=p.height,
                skipped_backpressure=p.skipped_backpressure,
                skipped_late=p.skipped_late,
                freezes=max(p.freezes, out["freezes"]),
                encoder_errors=p.encode_errors + self._encoder_open_errors,
            )
        if self._source is not None:
            out["grab_ms"] = round(self._source.stats().p50_ms, 3)
        return out

    async def stop(self, reason: str = "stopped") -> None:
        """Close the viewer, stop threads, close encoder, capture and display.  Idempotent."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(reason))
        await asyncio.shield(self._stop_task)
        consumer = self._event_task
        if consumer is not None and consumer is not asyncio.current_task() and not consumer.done():
            try:
                await asyncio.wait_for(asyncio.shield(consumer), EVENT_DRAIN_TIMEOUT_S)
            except TimeoutError:
                log.warning("session %s: event handler still busy after stop; cancelling it", self.spec.id)
                consumer.cancel()

    # -- start / stop --------------------------------------------------------------------

    async def _start(self) -> None:
        spec = self.spec
        rtc_configuration(spec.ice_servers)  # a malformed ICE server fails the start, not a viewer's offer
        if spec.kind == PoolKind.GAME.value and not spec.game_command:
            game = await self._open_game()
            self._source, self._sink = game, game
        else:
            if self.config.app_refusal:
                raise SessionRefused(self.config.app_refusal)
            app = spec.app_command if spec.kind == PoolKind.DESKTOP.value else spec.game_command
            env = app_env(os.environ)  # the node's tokens stay out of the user's desktop
            if self._on_gpu() and spec.gpu is not None:
                env = gpu_render_env(env, spec.gpu)
            env = {**env, **await self._start_audio()}
            fb_w = fb_h = None
            if spec.kind == PoolKind.DESKTOP.value and self.config.resize_max_side:
                self._viewport = viewport_policy.limits_for(spec.width, spec.height, self.config.resize_max_pixels,
                                                            self.config.resize_max_side)
                fb_w, fb_h = self._viewport.framebuffer
            self._display = VirtualDisplay(DisplayConfig(width=spec.width, height=spec.height, app=app or None,
                                                         env=env, max_width=fb_w, max_height=fb_h,
                                                         user=self.config.session_user))
            await self._display.start()
            backend = cast(Literal["auto", "x11grab", "mss"], self.config.capture_backend)
            self._source = await asyncio.to_thread(
                open_capture, self._display.name, spec.width, spec.height, backend=backend
            )
            self._sink = await XInputSink.open(self._display.name, f"rb-input-{spec.id}",
                                               PadSet(spec.id) if self.config.gamepad else None)
            selections = ("CLIPBOARD", "PRIMARY") if self.config.clipboard_primary else ("CLIPBOARD",)
            self._clipboard = ClipboardBridge(
                self._display.name, lambda event: self._peer is not None and self._peer.send_event(event),
                selections=selections, thread_name=f"rb-clip-{spec.id}")
            await self._clipboard.start()
            if app:
                self._spawn(self._watch_app(self._display))
        self._router = InputRouter(self._sink, on_resize=self._resize_requested,
                                   on_clipboard=self._clipboard.from_viewer if self._clipboard else None,
                                   on_viewer_stats=self._viewer_stats)
        self._probes = await probe_all_async(SENDABLE_BACKENDS, gpu=self._encoder_gpu())
        selection = choose_backend(
            self._probes,
            encoder_preference=self.config.encoder_preference,
            codec_preference=spec.codec,
            peer_codecs=AIORTC_VIDEO_CODECS,
        )
        self._selection_reasons = selection.reasons
        rung = ladder_policy.initial_state(self._ladder, self._profile.start_bps).rung
        encoder = await self._open_encoder(selection.backend, rung, self._profile.start_bps)
        self._pipeline = FramePipeline(
            self._source, encoder, rung.fps, name=f"rb-frames-{spec.id}", on_failure=self._pipeline_failed
        )
        self._pipeline.start()
        log.info(
            "session %s (%s %dx%d@%d) ready: %s; %s",
            spec.id, spec.kind, spec.width, spec.height, spec.fps, encoder, "; ".join(selection.reasons),
        )  # fmt: skip

    async def _stop(self, reason: str) -> None:
        self._state = "stopping"
        start = self._start_task
        if start is not None and not start.done() and start is not asyncio.current_task():
            start.cancel()  # start() tears down what it began, then re-raises
            await asyncio.wait({start})
        log.info("session %s stopping: %s", self.spec.id, reason)
        await self._teardown()
        self._state = "stopped"
        if self._event_task is not None:
            self._events.put_nowait(None)

    async def _teardown(self) -> None:
        """Release everything in reverse order; safe on a partly started runtime, idempotent."""
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current]
        for task in others:
            task.cancel()
        closing = [t for t in self._peer_tasks if t is not current]
        if others or closing:
            await asyncio.wait([*others, *closing])
        async with self._signal_lock:
            await self._share.close_all("stopped")
            await self._drop_peer("stopped")
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            await asyncio.to_thread(pipeline.close)
        if self._clipboard is not None:
            await self._clipboard.close()
        if isinstance(self._sink, XInputSink):
            await asyncio.to_thread(self._sink.close)
        if self._source is not None:
            await asyncio.to_thread(self._source.close)
        if self._display is not None:
            await self._display.close()
        await self._stop_audio()

    async def _start_audio(self) -> dict[str, str]:
        """The session's audio server and capture; returns the app's environment for it ({}: silent).

        Sound is optional: without pulseaudio/parec, or when they fail to start, the session runs
        silent (logged) rather than not at all.
        """
        if not self.config.audio:
            return {}
        missing = audio_available()
        if missing is not None:
            log.info("session %s has no sound: %s", self.spec.id, missing)
            return {}
        self._audio = AudioServer(user=self.config.session_user)
        try:
            await self._audio.start()
            self._audio_capture = AudioCapture(self._audio, PcmFramer())
            await self._audio_capture.start()
        except AudioError as exc:
            log.warning("session %s has no sound: %s", self.spec.id, exc)
            await self._stop_audio()
            return {}
        return self._audio.app_env()

    def _audio_track(self) -> PcmAudioTrack | None:
        """A new track of the session's sound for a viewer: captured (desktop), synthesized (game), or none."""
        if self._audio_capture is not None:
            return PcmAudioTrack(self._audio_capture.framer)
        if self._game_synth is not None:
            return PcmAudioTrack(SynthFramer(self._game_synth, wall_clock_ms))
        return None

    async def _stop_audio(self) -> None:
        capture, self._audio_capture = self._audio_capture, None
        server, self._audio = self._audio, None
        if capture is not None:
            await capture.close()
        if server is not None:
            await server.close()

    async def _watch_app(self, display: VirtualDisplay) -> None:
        status = await display.wait_app()
        await self._running.wait()  # an app that dies during start() is reported once we run
        self._end_self("app_exited", f"the app exited with status {status}")

    def _pipeline_failed(self, exc: BaseException) -> None:
        """Frame thread -> loop: the pipeline gave up."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the session is gone
            loop.call_soon_threadsafe(self._end_self, "capture_failed", repr(exc))

    def _end_self(self, reason: str, detail: str) -> None:
        """The runtime ends on its own: say so once, then stop."""
        if self._state not in ("starting", "running"):
            return
        log.warning("session %s ends by itself: %s (%s)", self.spec.id, reason, detail)
        self._emit("ended", {"reason": reason, "detail": detail})
        if self._self_stop is None:
            self._self_stop = asyncio.ensure_future(self.stop(reason))

    # -- signaling ---------------------------------------------------------------------

    async def _on_offer(self, msg: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self._state != "running" or self._pipeline is None or self._router is None:
            return [_error("not_running", f"session {self.spec.id} is {self._state}")]
        sdp = msg.get("sdp")
        early, self._early_candidates = self._early_candidates, []
        if not isinstance(sdp, str) or not sdp:
            return [_error("bad_offer", "offer without 'sdp'")]
        try:
            offer = parse_offer(sdp)
            selection = choose_backend(
                self._probes,
                encoder_preference=self.config.encoder_preference,
                codec_preference=self.spec.codec,
                peer_codecs=offer.video_codecs,
            )
        except OfferError as exc:
            log.info("session %s: offer refused: %s: %s", self.spec.id, exc.code, exc.detail)
            return [_error(exc.code, exc.detail, **exc.fields)]
        except NoEncoderError as exc:
            return [_error(exc.code, str(exc))]
        await self._drop_peer("replaced")
        async with self._encoder_lock:  # a resize in progress finishes first: its ladder is the one to use
            controller = StreamController(self._profile, self._ladder)
            await self._configure_encoder(selection.backend, controller.rung, self._profile.start_bps)
        self._encoder_bps = self._profile.start_bps
        self._selection_reasons = selection.reasons
        track = EncodedVideoTrack()
        peer = ViewerPeer(
            PeerSettings(ice_servers=self.spec.ice_servers, advertise_addresses=self.config.advertise_addresses,
                         playout_delay=self.config.playout_delay, udp_ports=self.config.udp_ports),
            track,
            self._router,
            target_bps=self._profile.start_bps,
            on_state=self._peer_state,
            on_channel_open=self._channel_open,
            on_keyframe_request=self._keyframe_requested,
            audio_track=self._audio_track(),
        )  # ice_servers were validated by start()
        try:
            answer = await peer.answer(sdp, selection.backend.webrtc_codec, early)
        except asyncio.CancelledError:  # the node gave up on this offer (its timeout, or the session stops)
            with contextlib.suppress(Exception):
                await peer.close()
            raise
        except Exception as exc:  # boundary: a viewer's SDP must never take the session down
            log.warning("session %s: offer rejected: %r", self.spec.id, exc)
            await peer.close()
            code = exc.code if isinstance(exc, OfferError) else "bad_offer"
            return [_error(code, str(exc) or type(exc).__name__)]
        self._peer, self._track, self._controller = peer, track, controller
        peer.set_frame_rate(controller.rung.fps)
        if self._first_offer_ms is None:
            self._first_offer_ms = time.monotonic() * 1000.0
        self._playout = None
        self._pipeline.attach(track)
        self._control_task = self._spawn(self._control_loop(peer, controller))
        log.info("session %s: answered a viewer with %s (%s), audio %s, node is DTLS %s, %d of %d early candidates "
                 "added", self.spec.id, peer.codec, selection.backend.name, peer.audio_codec or "none", peer.dtls_role,
                 peer.early_candidates, len(early))
        return [{"type": SignalType.ANSWER.value, "sdp": answer}]

    async def _on_candidate(self, msg: Mapping[str, Any]) -> None:
        """Add a trickled candidate to the viewer's connection, or hold it for the offer it precedes.

        Held: when there is no connection yet, or when the candidate names an ICE ufrag other than
        the current connection's offer (the viewer's next offer).  At most ``EARLY_CANDIDATES_MAX``.
        """
        ufrag = candidate_ufrag(msg)
        if self._peer is None or (ufrag is not None and ufrag != self._peer.remote_ufrag):
            if len(self._early_candidates) >= EARLY_CANDIDATES_MAX:
                log.info("session %s: over %d candidates before an offer, dropped", self.spec.id,
                         EARLY_CANDIDATES_MAX)
                return
            self._early_candidates.append(dict(msg))
            return
        try:
            await self._peer.add_candidate(msg)
        except Exception as exc:  # boundary: a malformed candidate is the viewer's problem
            log.info("session %s: bad candidate dropped: %r", self.spec.id, exc)

    async def _drop_peer(self, why: str) -> None:
        """Close the current viewer connection (caller holds the signal lock)."""
        peer, track = self._peer, self._track
        if peer is None:
            return
        self._first_frame()  # keep the figure before the peer goes
        self._peer = self._track = None
        self._viewer_freezes += peer.viewer_freezes
        if self._keyframe_timer is not None:
            self._keyframe_timer.cancel()
            self._keyframe_timer = None
        task, self._control_task = self._control_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task})
        if self._pipeline is not None and track is not None:
            self._pipeline.detach(track)
        was_connected, self._connected = self._connected, False
        self._send_rate_bps = None
        await peer.close()
        if was_connected and self._state == "running":
            self._emit("disconnected", {"reason": why})

    def _peer_state(self, peer: ViewerPeer, state: str) -> None:
        if peer is not self._peer or self._state != "running":
            return
        if state == "connected" and not self._connected:
            self._connected = True
            self._viewers += 1
            self._emit("connected", {"viewer": self._viewers, "codec": peer.codec, "encoder": self._encoder_name()})
        elif state in ("failed", "closed"):
            if state == "failed":
                self._peer_failed(peer)
            task = asyncio.ensure_future(self._peer_lost(peer, state))
            self._peer_tasks.add(task)
            task.add_done_callback(self._peer_tasks.discard)

    def _peer_failed(self, peer: ViewerPeer) -> None:
        """The viewer's connection failed: log why and send the viewer an ``error`` (a ``signal`` event)."""
        failure = peer.failure()
        if failure is not None and failure.stage == "dtls":
            msg = _error("dtls_failed", failure.detail)
        elif failure is not None:
            msg = _error("ice_failed", failure.detail)
        else:
            msg = _error("ice_failed", "the connection failed (no failed ICE or DTLS transport found)")
        log.warning("session %s: viewer connection failed: %s: %s", self.spec.id, msg["code"], msg["detail"])
        info: dict[str, Any] = {"msg": msg}
        if self._viewers == 0 and not self._start_failure_sent:  # no viewer ever connected: the start failed
            self._start_failure_sent = True
            info["start_failure"] = msg["code"]
        self._emit("signal", info)

    def _viewer_stats(self, glass_ms: tuple[float, ...]) -> None:
        """A ``vs`` message: its glass-to-glass samples go into the session's histogram (bad ones ignored)."""
        self._glass.observe(glass_ms, time.monotonic() * 1000.0)

    async def _peer_lost(self, peer: ViewerPeer, state: str) -> None:
        async with self._signal_lock:
            if peer is self._peer:
                await self._drop_peer(state)

    def _channel_open(self, peer: ViewerPeer) -> None:
        if peer is self._peer and self._pending_warning is not None:
            peer.send_event(self._pending_warning)
        if peer is self._peer and self._clipboard is not None:
            self._clipboard.viewer_ready()

    # -- resize (the viewer's window -> the desktop's screen) -------------------------------

    def _resize_requested(self, width: int, height: int) -> None:
        """An "rs" message: set the screen to the fitting size (streamer.abr.viewport), latest request wins."""
        if self._viewport is None or self._display is None:
            log.debug("session %s: resize to %dx%d ignored (%s)", self.spec.id, width, height,
                      "built-in game" if self._display is None else "resizing is off")
            return
        size = viewport_policy.fit(width, height, self._viewport)
        if size == (self._want_size or self._display.size):
            return
        self._want_size = size
        if self._resize_task is None:
            self._resize_task = self._spawn(self._apply_resizes())

    async def _use_capture(self, width: int, height: int) -> bool:
        """Open a capture of ``width x height`` and wait until the frame thread grabs from it (False: stopped)."""
        assert self._display is not None
        source = await asyncio.to_thread(open_capture, self._display.name, width, height,
                                         backend=cast(Literal["auto", "x11grab", "mss"], self.config.capture_backend))
        if self._pipeline is None:
            source.close()
            return False
        installed = self._pipeline.replace_source(source)
        self._source = source
        await asyncio.to_thread(installed.wait, SOURCE_SWITCH_TIMEOUT_S)
        return True

    async def _apply_resizes(self) -> None:
        """Set the wanted size until it holds: RandR, a capture at that size, the ladder rebuilt, a new encoder."""
        try:
            while self._display is not None and self._want_size not in (None, self._display.size):
                await self._running.wait()
                width, height = size = self._want_size
                t0 = time.perf_counter()
                old = self._display.size
                # A capture never grabs outside the screen (x11grab fails there): first a capture of
                # the part both sizes share, in use before the screen changes; then, if the screen
                # grew along a side, one of the new size once it has.
                shared = (min(width, old[0]), min(height, old[1]))
                try:
                    if shared != old and not await self._use_capture(*shared):
                        return
                    await self._display.resize(width, height)
                    if size != shared and not await self._use_capture(width, height):
                        return
                except Exception as exc:  # boundary: a failed resize keeps (or restores) the old screen
                    log.warning("session %s: resize to %dx%d failed: %r", self.spec.id, width, height, exc)
                    self._want_size = None
                    with contextlib.suppress(Exception):
                        await self._use_capture(*shared)
                        await self._display.resize(*old)
                        await self._use_capture(*old)
                    return
                if self._pipeline is None:
                    return
                self._ladder = ladder_policy.desktop_ladder(width, height, self.spec.fps)
                rung = (self._controller.set_ladder(self._ladder) if self._controller is not None
                        else ladder_policy.initial_state(self._ladder, self._profile.start_bps).rung)
                async with self._encoder_lock:
                    await self._configure_encoder(self._pipeline.encoder.backend, rung,
                                                  self._encoder_bps or self._profile.start_bps)
                self.resizes += 1
                log.info("session %s: screen %dx%d, encoding %dx%d@%d, in %.0f ms", self.spec.id, *size,
                         rung.width, rung.height, rung.fps, (time.perf_counter() - t0) * 1000)
        finally:
            self._resize_task = None

    def _keyframe_requested(self) -> None:
        """PLI/FIR: pass on at most one per ``keyframe_min_interval_ms``; a request inside it is deferred."""
        self._keyframe_requests += 1
        if self._keyframe_timer is not None:
            return  # one deferred request is already scheduled
        wait_s = self._last_keyframe_s + self.config.keyframe_min_interval_ms / 1000.0 - time.monotonic()
        if wait_s <= 0:
            self._send_keyframe()
        else:
            self._keyframe_timer = asyncio.get_running_loop().call_later(wait_s, self._send_keyframe)

    def _repair_stall(self, stalled_ms: float | None, now_s: float) -> None:
        """The viewer's picture froze on a frame that cannot complete: a keyframe ends it."""
        limit_ms = self.config.stall_keyframe_ms
        if stalled_ms is None or limit_ms <= 0 or stalled_ms < limit_ms:
            return
        interval_s = self.config.stall_keyframe_interval_ms / 1000.0
        if self._stall_keyframe_s is not None and now_s - self._stall_keyframe_s < interval_s:
            return
        if now_s - self._last_keyframe_s < interval_s:
            return  # a keyframe (PLI, new viewer) is already on its way
        self._stall_keyframe_s = now_s
        self._stall_keyframes += 1
        log.info("session %s: viewer frozen %.0f ms with packets arriving: keyframe", self.spec.id, stalled_ms)
        if self._keyframe_timer is None:
            self._send_keyframe()

    def _send_keyframe(self) -> None:
        self._keyframe_timer = None
        self._last_keyframe_s = time.monotonic()
        if self._pipeline is not None:
            self._pipeline.request_keyframe()

    # -- control -----------------------------------------------------------------------

    async def _control_loop(self, peer: ViewerPeer, controller: StreamController) -> None:
        """Every ``stats_interval_ms``: feedback -> bitrate/ladder decisions -> encoder; stats to the viewer."""
        interval_s = self.config.stats_interval_ms / 1000.0
        client_every = max(1, self.config.client_stats_interval_ms // self.config.stats_interval_ms)
        # (time, bytes sent, packets sent, packets retransmitted) over the window
        sent: deque[tuple[float, int, int, int]] = deque([(time.monotonic(), 0, 0, peer.retransmits.sent)])
        loss = LossWindow()
        sent_log = SendLog()  # packets sent (media + retransmissions), for the viewer's receive window
        probe_rtt: float | None = None
        playout = playout_policy.PlayoutState()
        tick = 0
        while True:
            await asyncio.sleep(interval_s)
            try:
                remote = await peer.poll_feedback()
                now = time.monotonic()
                # send rate over the last SEND_RATE_WINDOW_S: one period holds a few frames, and a
                # keyframe or a frame straddling two periods makes a single period's rate swing
                while len(sent) > 1 and sent[1][0] <= now - SEND_RATE_WINDOW_S:
                    sent.popleft()
                t0, b0, p0, r0 = sent[0]
                packets = remote.packets_sent - p0
                packet_bytes = (remote.bytes_sent - b0) / packets if packets > 0 else None
                # aiortc's byte count leaves retransmissions out: they are counted by the limiter,
                # at the mean packet size (a NACKed packet is as big as the others)
                retransmitted = peer.retransmits.sent
                rtx_bytes = (retransmitted - r0) * (packet_bytes or RTX_PACKET_BYTES)
                send_rate = round((remote.bytes_sent - b0 + rtx_bytes) * 8 / (now - t0)) if now > t0 else None
                self._retransmit_bps = round(rtx_bytes * 8 / (now - t0)) if now > t0 else 0
                sent.append((now, remote.bytes_sent, remote.packets_sent, retransmitted))
                now_ms = int(now * 1000)
                sent_log.add(now * 1000, remote.packets_sent + retransmitted)
                if remote.probe.rtt_ms is not None:
                    probe_rtt = remote.probe.rtt_ms
                lost = loss.fraction_lost(remote.report)
                feedback = feedback_from_remote(
                    remote, send_rate, packet_bytes, lost, sent_log, probe_rtt, self._send_jitter_ms()
                )
                frame_load = self._pipeline.load if self._pipeline is not None else None
                step = controller.update(feedback, now_ms, frame_load or None)
                self._decisions.append(step.record(now_ms))
                self._decision_counts[step.bitrate.reason.value] += 1
                self._note_feedback(remote, send_rate, lost)
                self._repair_stall(remote.probe.stalled_ms, now)
                playout = self._steer_playout(peer, playout, remote, now_ms)
                await self._apply(step)
                tick += 1
                if tick % client_every == 0:
                    peer.send_event(self._client_stats())
            except Exception:  # task boundary: one bad period must not end control
                log.exception("session %s: control step failed", self.spec.id)

    def _steer_playout(
        self, peer: ViewerPeer, state: playout_policy.PlayoutState, remote: RemoteFeedback, now_ms: int
    ) -> playout_policy.PlayoutState:
        """The path's share of the viewer's jitter (receiver reports) -> the playout-delay range its packets carry."""
        if not peer.playout_delay:
            return state
        jitter = None
        if remote.report is not None:
            viewer_ms = bitrate_policy.jitter_ms_from_rtp(remote.report.jitter)
            jitter = playout_policy.path_jitter_ms(viewer_ms, self._send_jitter_ms())
        decision = playout_policy.decide(state, jitter, now_ms)
        self._playout = decision
        if decision.changed:
            log.info("session %s: playout delay %d-%d ms (%s, jitter %.1f ms)", self.spec.id, decision.min_ms,
                     decision.max_ms, decision.reason.value, decision.peak_jitter_ms or 0.0)
            peer.set_playout_delay(PlayoutDelay(decision.min_ms, decision.max_ms))
        return decision.state

    async def _apply(self, step: ControlStep) -> None:
        if self._peer is not None:
            # random loss (no queue): a retransmission goes out twice, so a lost one costs no round trip
            self._peer.set_target(
                step.bitrate.target_bps,
                bitrate_policy.queue_free(step.bitrate.signals),
                frame_interval_ms=1000.0 / step.ladder.rung.fps,
            )
        if self._pipeline is None:
            return
        self._owner_encoder_bps = media_bps(step.encoder_bps, self._retransmit_bps)
        encoder_bps = self._share.cap_bps(self._owner_encoder_bps)
        self._share.set_target(encoder_bps, 1000.0 / step.ladder.rung.fps)
        if step.ladder.rung not in self._ladder.rungs:  # decided on an older screen size's ladder
            if self._controller is not None:
                self._controller.set_ladder(self._ladder)
            return
        if step.ladder.changed:
            rung = step.ladder.rung
            log.info(
                "session %s: ladder %s -> %dx%d@%d (target %d bps)",
                self.spec.id, step.ladder.reason.value, rung.width, rung.height, rung.fps, step.bitrate.target_bps,
            )  # fmt: skip
            if self._peer is not None:
                self._peer.set_frame_rate(rung.fps)
            async with self._encoder_lock:
                await self._configure_encoder(self._pipeline.encoder.backend, rung, encoder_bps)
            self._encoder_bps = encoder_bps
        elif encoder_bps != self._encoder_bps:
            log.debug(
                "session %s: bitrate %s -> %d bps (encoder %d)",
                self.spec.id, step.bitrate.reason.value, step.bitrate.target_bps, encoder_bps,
            )  # fmt: skip
            self._pipeline.set_bitrate(encoder_bps)
            self._encoder_bps = encoder_bps

    def _share_changed(self) -> None:
        """A share viewer connected, left or sent a new estimate: the encoder follows the cap at once."""
        if self._pipeline is None or self._state != "running":
            return
        bps = self._share.cap_bps(self._owner_encoder_bps or self._encoder_bps or self._profile.start_bps)
        if bps != self._encoder_bps:
            log.info("session %s: encoder %s -> %d bps (%d share viewer(s))", self.spec.id, self._encoder_bps, bps,
                     len(self._share))
            self._pipeline.set_bitrate(bps)
            self._encoder_bps = bps
        self._share.set_target(bps, 1000.0 / self._pipeline.fps)

    def _note_feedback(self, remote: RemoteFeedback, send_rate: int | None, fraction_lost: int | None) -> None:
        self._send_rate_bps = send_rate
        if remote.remb_bps is not None:
            self._remote["remb_bps"] = remote.remb_bps
        if remote.rtt_ms is not None:
            self._remote["rtt_ms"] = round(remote.rtt_ms, 2)
        if remote.report is not None:
            self._remote["jitter_ms"] = round(bitrate_policy.jitter_ms_from_rtp(remote.report.jitter), 2)
        if fraction_lost is not None:
            self._remote["loss"] = round(fraction_lost / bitrate_policy.FRACTION_LOST_SCALE, 4)

    def _first_frame(self) -> float | None:
        """Time to first frame: the first offer answered -> the first frame a viewer reported decoded, ms."""
        peer = self._peer
        if self._first_frame_ms is None and self._first_offer_ms is not None and peer is not None \
                and peer.first_decoded_ms is not None:
            self._first_frame_ms = round(max(0.0, peer.first_decoded_ms - self._first_offer_ms), 1)
        return self._first_frame_ms

    def _send_jitter_ms(self) -> float:
        """The node's own share of the viewer's jitter (``EncodedVideoTrack.send_jitter_ms``)."""
        return self._track.send_jitter_ms if self._track is not None else 0.0

    def _playout_range(self) -> list[int] | None:
        if self._peer is None or not self._peer.playout_delay:
            return None
        d = self._playout
        return [d.min_ms, d.max_ms] if d is not None else [0, 0]

    def _client_stats(self) -> dict[str, Any]:
        s = self.stats()
        keys = (
            "fps",
            "bitrate_bps",
            "target_bps",
            "rtt_ms",
            "probe_rtt_ms",
            "jitter_ms",
            "loss",
            "encoder",
            "codec",
            "width",
            "height",
            "send_jitter_ms",
        )
        # the built-in game (numpy or GL) has known controls; a desktop or a game command has none to show
        controls = ControlScheme.BUILTIN_GAME.value if s["source"] in ("game", "game-gl") else None
        return {"t": NodeEventType.STATS.value, **{k: s[k] for k in keys}, "encode_ms": s["encode_ms"],
                "controls": controls}

    async def _configure_encoder(self, backend: Backend, rung: Rung, bitrate_bps: int) -> None:
        """Make the pipeline encode with ``backend`` at ``rung``: a live bitrate change if it already does."""
        assert self._pipeline is not None
        current = self._pipeline.encoder
        cfg = current.config
        if current.backend == backend and (cfg.width, cfg.height, cfg.fps) == (rung.width, rung.height, rung.fps):
            self._pipeline.set_bitrate(bitrate_bps)
            return
        try:
            encoder = await self._open_encoder(backend, rung, bitrate_bps)
        except Exception:
            self._encoder_open_errors += 1
            raise
        if self._pipeline is None:  # stopped while the encoder opened
            encoder.close()
            return
        self._pipeline.replace_encoder(encoder)
        self._pipeline.set_fps(rung.fps)

    async def _open_encoder(self, backend: Backend, rung: Rung, bitrate_bps: int) -> VideoEncoder:
        source_format = "bgr0" if self._source is not None and self._source.backend == "x11grab" else "bgra"
        config = EncoderConfig(rung.width, rung.height, float(rung.fps), bitrate_bps, source_format=source_format,
                               gpu=self._encoder_gpu())
        return await asyncio.to_thread(VideoEncoder, backend, config)

    def _new_game(self, width: int, height: int) -> Game:
        game = self._game_factory(width, height)
        if self._game_synth is not None:
            game.on_sound = self._game_synth.add
        return game

    async def _open_game(self) -> GameSource:
        """The built-in game with the configured renderer, started off the event loop."""
        spec, wanted = self.spec, self.config.game_renderer
        if wanted == "cpu" or (wanted == "auto" and not self._on_gpu()):
            return GameSource(self._new_game(spec.width, spec.height), wall_clock_ms)
        device = spec.gpu if self._on_gpu() else None  # EGL device = the seat's GPU (see docs/gpu.md)
        game = GameSource(self._new_game(spec.width, spec.height), wall_clock_ms, renderer="gl",
                          gl_device=device)
        try:
            await asyncio.to_thread(game.prepare)
        except GameRendererUnavailable as exc:
            game.close()
            if wanted == "gl":
                raise
            log.warning("session %s: OpenGL game renderer unavailable on GPU %s (%s); rendering with numpy",
                        spec.id, device, exc.reason)
            return GameSource(self._new_game(spec.width, spec.height), wall_clock_ms)
        log.info("session %s: game renders with OpenGL on %s", spec.id, game.renderer_string)
        return game

    def _on_gpu(self) -> bool:
        return self.config.gpu_render and self.spec.gpu is not None

    def _encoder_gpu(self) -> int | None:
        """The GPU a hardware encoder opens on: the seat's, on a host with NVIDIA GPUs."""
        return self.spec.gpu if self._on_gpu() else None

    def _encoder_name(self) -> str | None:
        return self._pipeline.encoder.backend.name if self._pipeline is not None else None

    # -- tasks and events ----------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("session %s: background task failed", self.spec.id, exc_info=task.exception())

    def _emit(self, name: str, info: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        self._events.put_nowait((name, info))
        if self._event_task is None:
            self._event_task = asyncio.ensure_future(self._deliver_events())

    async def _deliver_events(self) -> None:
        assert self._on_event is not None
        while True:
            item = await self._events.get()
            if item is None:
                return
            name, info = item
            try:
                await self._on_event(name, info)
            except Exception:  # task boundary: the owner's handler failed; keep delivering
                log.exception("session %s: on_event(%r) failed", self.spec.id, name)


def _error(code: str, detail: str, **fields: Any) -> dict[str, Any]:
    return {"type": SignalType.ERROR.value, "code": code, "detail": detail, **fields}
