"""Domain values and the request schemas that produce them.

Pure data: pool configuration, GPU and host descriptions, session profiles, and
the body schemas (``broker.validate``) for every write endpoint.  Conversions
from validated dicts to frozen dataclasses live here so handlers stay thin.

Invariant: every value built here has passed its schema, so downstream code
(placement, Lua scripts) never sees a negative seat count or an unknown strategy.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any, Final

from broker.errors import ValidationError
from broker.protocol import PlacementStrategy, PoolKind, StartFailure, WatchdogCheck
from broker.validate import Field, validate

NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")  # pool/host ids: DNS-label-like
TAB_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a browser tab's id (signaling ?tab=, /leave?tab=)
USER_RE: Final = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")
# A node version (an image tag, a package version, a build id): printable ASCII, no blanks at either end
VERSION_RE: Final = re.compile(r"^(?:[\x21-\x7e](?:[\x20-\x7e]{0,62}[\x21-\x7e])?)?$")

MAX_WIDTH_PX: Final = 7680  # 8K UHD
MAX_HEIGHT_PX: Final = 4320
MAX_FPS: Final = 240
DAY_S: Final = 86_400
CODECS: Final = ("auto", "h264", "vp8", "hevc", "av1")
ENCODE_MODES: Final = ("nvenc", "software")  # how a registered GPU encodes
THROTTLE_REASON_MAX_LEN: Final = 32  # short names such as "hw_thermal" (streamer/node/gpus.py)


def check_version(value: str, field: str) -> str:
    """Versions are compared and shown as given: printable ASCII, at most 64 characters, no outer blanks."""
    if not VERSION_RE.fullmatch(value):
        raise ValidationError(f"{field}: must be printable ASCII without blanks at either end, at most 64 "
                              "characters", field=field)
    return value


def check_name(value: str, field: str) -> str:
    """Pool and host names are lowercase DNS-label-like identifiers."""
    if not NAME_RE.fullmatch(value):
        raise ValidationError(f"{field}: must match {NAME_RE.pattern}", field=field)
    return value


POOL_SCHEMA: Final = {
    "kind": Field("str", default=PoolKind.DESKTOP.value, choices=tuple(k.value for k in PoolKind),
                  description="What a session runs: a virtual desktop or a game"),
    "strategy": Field("str", default=PlacementStrategy.BREADTH_FIRST.value,
                      choices=tuple(s.value for s in PlacementStrategy)),
    "max_sessions_per_gpu": Field("int", default=4, minimum=1, maximum=64),
    "vram_per_session_mb": Field("int", default=2048, minimum=1, maximum=1_048_576),
    "vram_headroom": Field("number", default=0.2, minimum=0.0, maximum=0.95,
                           description="Fraction of each GPU's VRAM kept free"),
    "max_queue": Field("int", default=100, minimum=0, maximum=100_000),
    "queue_timeout_s": Field("int", default=600, minimum=1, maximum=DAY_S),
    "idle_timeout_s": Field("int", default=1800, minimum=0, maximum=7 * DAY_S,
                            description="0 disables the idle timeout"),
    "disconnect_timeout_s": Field("int", default=300, minimum=0, maximum=DAY_S),
    "close_grace_s": Field("int", default=30, minimum=0, maximum=DAY_S,
                           description="A viewer that closed its tab on purpose (pagehide) keeps its seat this long "
                                       "(at most disconnect_timeout_s); a network drop keeps disconnect_timeout_s"),
    "max_duration_s": Field("int", default=8 * 3600, minimum=0, maximum=30 * DAY_S,
                            description="0 disables the maximum duration"),
    "max_sessions_per_user": Field("int", default=1, minimum=1, maximum=64),
    "allow_resize": Field("bool", default=True),
    "announce_shadow": Field("bool", default=True,
                             description="An admin shadowing a session (a share link of their own) is announced to "
                                         "the session's owner (a 'shadowed' warning on its event stream)"),
    "staged": Field("int", default=0, minimum=0, maximum=64,
                    description="Sessions kept started on the pool's hosts (display, app and encoder running), "
                                "not yet any user's: the next users who ask are handed one, and it is refilled. "
                                "Each holds a seat; 0 stages none"),
    "description": Field("str", default="", max_length=500),
}


@dataclass(frozen=True)
class PoolConfig:
    """A pool of GPU hosts sharing placement rules and timeouts."""

    name: str
    kind: str = PoolKind.DESKTOP.value
    strategy: str = PlacementStrategy.BREADTH_FIRST.value
    max_sessions_per_gpu: int = 4
    vram_per_session_mb: int = 2048
    vram_headroom: float = 0.2
    max_queue: int = 100
    queue_timeout_s: int = 600
    idle_timeout_s: int = 1800
    disconnect_timeout_s: int = 300
    close_grace_s: int = 30
    max_duration_s: int = 8 * 3600
    max_sessions_per_user: int = 1
    allow_resize: bool = True
    announce_shadow: bool = True  # tell the owner when an admin starts watching their session
    staged: int = 0  # warm sessions kept ready for the next users (see store/lua/prelude.lua, restage)
    description: str = ""

    @classmethod
    def from_body(cls, name: str, body: Any) -> PoolConfig:
        return cls(name=check_name(name, "name"), **validate(body, POOL_SCHEMA))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolConfig:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


GPU_SCHEMA: Final = {
    "index": Field("int", required=True, minimum=0, maximum=63),
    "model": Field("str", default="unknown", max_length=128),
    "vram_mb": Field("int", required=True, minimum=1, maximum=1_048_576),
    "encoder_session_limit": Field("int", nullable=True, minimum=0, maximum=1024,
                                   description="NVENC concurrent session limit; null = unlimited"),
    "nvenc": Field("bool", default=False, description="True when an NVENC probe really encoded on this GPU"),
    "encode": Field("str", nullable=True, choices=ENCODE_MODES,
                    description="How this GPU's sessions encode; null (older nodes) = nvenc if nvenc else software"),
    "reason": Field("str", default="", max_length=200, description="Why the node registered it so (for operators)"),
}

CANDIDATE_TYPES: Final = ("host", "srflx", "relay")
MAX_COUNT: Final = 2**53  # cumulative counters stay exact in JSON numbers (and Lua's doubles)
MAX_FIRST_FRAME_MS: Final = 3_600_000.0  # an hour: anything longer is a broken clock, not a slow start

SESSION_TELEMETRY_SCHEMA: Final = {
    "id": Field("str", required=True, max_length=64),
    "state": Field("str", default="running", choices=("starting", "running", "disconnected")),
    "last_input_ms": Field("int", nullable=True, minimum=0),
    "fps": Field("number", nullable=True, minimum=0, maximum=1000),
    "target_fps": Field("number", nullable=True, minimum=0, maximum=1000,
                        description="frame rate the session's ladder asks for (fps / target_fps = delivered share)"),
    "encode_ms": Field("number", nullable=True, minimum=0),
    "bitrate_bps": Field("number", nullable=True, minimum=0),
    "target_bps": Field("number", nullable=True, minimum=0),
    "rtt_ms": Field("number", nullable=True, minimum=0),
    "jitter_ms": Field("number", nullable=True, minimum=0),
    "loss": Field("number", nullable=True, minimum=0, maximum=1),
    "keyframes": Field("int", nullable=True, minimum=0),
    "encoder": Field("str", nullable=True, max_length=64),
    "width": Field("int", nullable=True, minimum=0, maximum=MAX_WIDTH_PX),
    "height": Field("int", nullable=True, minimum=0, maximum=MAX_HEIGHT_PX),
    "candidate": Field("str", nullable=True, choices=CANDIDATE_TYPES,
                       description="how the viewer's media travels: host (direct), srflx (through a NAT) "
                                   "or relay (TURN)"),
    "freezes": Field("int", nullable=True, minimum=0, maximum=MAX_COUNT,
                     description="freezes so far: the picture stood still 200 ms or more (3 frame intervals at "
                                 "low rates), as the viewer's decoded frames or the node's sent frames show"),
    "encoder_errors": Field("int", nullable=True, minimum=0, maximum=MAX_COUNT,
                            description="frames the encoder failed on and encoders that failed to open, so far"),
    "first_frame_ms": Field("number", nullable=True, minimum=0, maximum=MAX_FIRST_FRAME_MS,
                            description="time to first frame: the first viewer offer answered -> the first frame "
                                        "a viewer reported decoded, ms"),
}

GPU_TELEMETRY_SCHEMA: Final = {
    "index": Field("int", required=True, minimum=0, maximum=63),
    "utilization": Field("number", nullable=True, minimum=0, maximum=100),
    "vram_used_mb": Field("number", nullable=True, minimum=0),
    "encoder_utilization": Field("number", nullable=True, minimum=0, maximum=100),
    "vram_total_mb": Field("number", nullable=True, minimum=0),
    "encoder_sessions": Field("int", nullable=True, minimum=0),
    "encoder_fps": Field("number", nullable=True, minimum=0, maximum=100_000,
                         description="Average fps over the GPU's active encoder sessions"),
    "encoder_latency_us": Field("number", nullable=True, minimum=0,
                                description="Average encode latency over active sessions, microseconds"),
    "temperature_c": Field("number", nullable=True, minimum=-50, maximum=150),
    "power_w": Field("number", nullable=True, minimum=0, maximum=5000),
    "throttle_reasons": Field("array", nullable=True, max_items=16,
                              items=Field("str", max_length=THROTTLE_REASON_MAX_LEN),
                              description="Active NVML clock-event (throttle) reasons, short names"),
}

WATCHDOG_REPORT_SCHEMA: Final = {
    "tripped": Field("array", default=[], max_items=len(WatchdogCheck),
                     items=Field("str", choices=tuple(WatchdogCheck)),
                     description="the checks that failed since the node's watchdog drained the host (empty: it "
                                 "has not)"),
    "held": Field("bool", default=False,
                  description="the watchdog tripped too often and holds the drain until an operator undrains"),
}

HISTOGRAM_MAX_BUCKETS: Final = 32  # bucket bounds a node-kept histogram may have
MAX_HISTOGRAM_MS: Final = 3_600_000.0  # an hour: no bucket bound of a latency is longer

# A node-kept histogram of milliseconds (streamer.media.glass's wire form): "counts" has one count per
# bound, each counting the values over the previous bound up to its own, and one more over the last bound.
HISTOGRAM_MS_SCHEMA: Final = {
    "le": Field("array", required=True, max_items=HISTOGRAM_MAX_BUCKETS,
                items=Field("number", minimum=0, maximum=MAX_HISTOGRAM_MS),
                description="bucket upper bounds, ms, increasing"),
    "counts": Field("array", required=True, max_items=HISTOGRAM_MAX_BUCKETS + 1,
                    items=Field("int", minimum=0, maximum=MAX_COUNT),
                    description="values per bucket (not cumulative): len(le) + 1 counts, the last over the last bound"),
    "sum": Field("number", required=True, minimum=0, description="sum of the values, ms"),
}

START_FAILURES_SCHEMA: Final = {
    reason.value: Field("int", default=0, minimum=0, maximum=MAX_COUNT) for reason in StartFailure
}

HEARTBEAT_SCHEMA: Final = {
    "gpus": Field("array", default=[], items=Field("object", schema=GPU_TELEMETRY_SCHEMA), max_items=64),
    "sessions": Field("array", default=[], items=Field("object", schema=SESSION_TELEMETRY_SCHEMA),
                      max_items=1024),
    "cpu_percent": Field("number", nullable=True, minimum=0, maximum=100_000),
    "freezes_total": Field("int", nullable=True, minimum=0, maximum=MAX_COUNT,
                           description="freezes of every session this node ran since it started (a counter)"),
    "encoder_errors_total": Field("int", nullable=True, minimum=0, maximum=MAX_COUNT,
                                  description="encoder errors of every session this node ran since it started "
                                              "(a counter)"),
    "watchdog": Field("object", nullable=True, schema=WATCHDOG_REPORT_SCHEMA,
                      description="the node watchdog's state (null or absent: the node runs none)"),
    "session_starts_total": Field("int", nullable=True, minimum=0, maximum=MAX_COUNT,
                                  description="session starts this node attempted since it started (a counter)"),
    "session_start_failures_total": Field("object", nullable=True, schema=START_FAILURES_SCHEMA,
                                          description="session start failures by reason since the node started "
                                                      "(counters; a reason left out is 0)"),
    "glass_to_glass_ms": Field("object", nullable=True, schema=HISTOGRAM_MS_SCHEMA,
                               description="glass-to-glass latency its sessions' viewers reported since the node "
                                           "started (a histogram, ms)"),
}


def validate_heartbeat(body: Any) -> dict[str, Any]:
    """``HEARTBEAT_SCHEMA`` plus what a schema cannot say: a histogram's bounds increase and it has
    one count more than bounds.  Raises ``ValidationError`` naming the field."""
    data = validate(body, HEARTBEAT_SCHEMA)
    histogram = data.get("glass_to_glass_ms")
    if histogram is not None:
        bounds, counts = histogram["le"], histogram["counts"]
        if not bounds or any(b <= a for a, b in pairwise(bounds)):
            raise ValidationError("glass_to_glass_ms.le: must be a non-empty list of increasing bounds",
                                  field="glass_to_glass_ms.le")
        if len(counts) != len(bounds) + 1:
            raise ValidationError(f"glass_to_glass_ms.counts: must have {len(bounds) + 1} counts (one per bound "
                                  "and one over the last)", field="glass_to_glass_ms.counts")
    return data

PROFILE_SCHEMA: Final = {
    "width": Field("int", default=1280, minimum=160, maximum=MAX_WIDTH_PX),
    "height": Field("int", default=720, minimum=120, maximum=MAX_HEIGHT_PX),
    "fps": Field("int", default=30, minimum=1, maximum=MAX_FPS),
    "codec": Field("str", default="auto", choices=CODECS),
}

HOST_SESSION_SCHEMA: Final = {
    "id": Field("str", required=True, max_length=32),
    "user": Field("str", required=True, max_length=128),
    "state": Field("str", required=True, choices=("running", "disconnected")),
    "gpu": Field("int", required=True, minimum=0, maximum=1023),
    "kind": Field("str", default=None, nullable=True, max_length=16),
    "profile": Field("object", default=None, nullable=True, schema=PROFILE_SCHEMA),
    "started_ms": Field("int", default=0, minimum=0, maximum=2**53, description="When it started running (epoch ms)"),
}

HOST_SCHEMA: Final = {
    "id": Field("str", required=True, max_length=63),
    "pool": Field("str", required=True, max_length=63),
    "address": Field("str", required=True, max_length=255, description="host:port the node listens on"),
    "gpus": Field("array", required=True, items=Field("object", schema=GPU_SCHEMA), max_items=64),
    "labels": Field("object", default=None, nullable=True, schema={}),
    "version": Field("str", default="", max_length=64),
    "sessions": Field("array", default=[], items=Field("object", schema=HOST_SESSION_SCHEMA), max_items=256,
                      description="Sessions the node is still streaming (re-registering after the broker lost its "
                                  "live state): the broker re-adopts each on this host, or lists it in stop"),
}

SESSION_SCHEMA: Final = {
    "pool": Field("str", required=True, max_length=63),
    "profile": Field("object", default=None, nullable=True, schema=PROFILE_SCHEMA),
}

SESSION_STATE_SCHEMA: Final = {
    "state": Field("str", required=True, choices=("running", "disconnected", "ended")),
    "reason": Field("str", default="node_ended", max_length=64),
}

SHARE_SCHEMA: Final = {
    "role": Field("str", default="view", choices=("view",),
                  description="What the link's viewers may do: view only (their input is dropped)"),
    "ttl_s": Field("int", default=3600, minimum=60, maximum=DAY_S, description="The token's life in seconds"),
}

CONTROL_SCHEMA: Final = {
    "viewer": Field("str", required=True, max_length=16, pattern_hint="^[0-9a-f]{16}$",
                    description="The connected share viewer (an id from GET /sessions/{id}/shares) to hand control to"),
}

TOKEN_SCHEMA: Final = {
    "user": Field("str", required=True, max_length=128),
    "ttl_s": Field("int", default=3600, minimum=60, maximum=90 * DAY_S),
}


@dataclass(frozen=True)
class Gpu:
    """A registered GPU (or CPU seat group); ``encode`` says whether its sessions use NVENC or software."""

    index: int
    vram_mb: int
    model: str = "unknown"
    encoder_session_limit: int | None = None
    nvenc: bool = False
    encode: str = "software"  # one of ENCODE_MODES
    reason: str = ""


@dataclass(frozen=True)
class Profile:
    width: int = 1280
    height: int = 720
    fps: int = 30
    codec: str = "auto"

    @classmethod
    def from_body(cls, body: Any) -> Profile:
        data = validate(body or {}, PROFILE_SCHEMA, prefix="profile.")
        if data["width"] % 2 or data["height"] % 2:
            raise ValidationError("profile.width: width and height must be even (4:2:0 video)",
                                  field="profile.width" if data["width"] % 2 else "profile.height")
        return cls(**data)


def parse_host(body: Any) -> tuple[dict[str, Any], list[Gpu]]:
    """Validate a host registration; returns (host fields, GPUs)."""
    data = validate(body, HOST_SCHEMA)
    check_name(data["id"], "id")
    check_name(data["pool"], "pool")
    check_version(data["version"], "version")
    for i, g in enumerate(data["gpus"]):
        if g["encode"] is None:  # nodes from before "encode" existed
            g["encode"] = "nvenc" if g["nvenc"] else "software"
        elif g["encode"] == "nvenc" and not g["nvenc"]:
            raise ValidationError(f"gpus[{i}].encode: nvenc needs nvenc: true (a probe that encoded)",
                                  field=f"gpus[{i}].encode")
    gpus = [Gpu(**g) for g in data["gpus"]]
    if not gpus:
        raise ValidationError("gpus: a host needs at least one GPU (or one declared CPU seat group)",
                              field="gpus")
    seen: set[int] = set()
    for i, g in enumerate(gpus):
        if g.index in seen:
            raise ValidationError(f"gpus[{i}].index: duplicate GPU index {g.index}", field=f"gpus[{i}].index")
        seen.add(g.index)
    return data, gpus


def parse_user(value: str) -> str:
    if not USER_RE.fullmatch(value):
        raise ValidationError(f"user: must match {USER_RE.pattern}", field="user")
    return value
