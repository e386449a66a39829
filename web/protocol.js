// Wire constants shared with the broker and the render node: a copy of broker/protocol.py.
//
// tests/web/test_protocol_sync.py parses this file and requires every export to equal the
// Python value of the same name (enums as {NAME: value}, frozensets as sorted arrays,
// scalars as themselves), and every Python enum and scalar constant to be exported here.
// So keep the format machine-readable: one `export const NAME = ...;` per constant, the
// value a JSON literal (double-quoted keys, no trailing commas), optionally wrapped in
// Object.freeze(...), and the closing `);` or `;` at the end of its line.
// Change broker/protocol.py first, then mirror it here.

export const API_PREFIX = "/api/v1";

// the client protocol version docs/protocol.md describes
export const PROTOCOL_VERSION = 8;

// ---- session lifecycle --------------------------------------------------------------

export const SessionState = Object.freeze({
  "QUEUED": "queued",
  "STARTING": "starting",
  "RUNNING": "running",
  "DISCONNECTED": "disconnected",
  "ENDED": "ended"
});

export const LIVE_STATES = Object.freeze(["disconnected", "queued", "running", "starting"]);

export const SEATED_STATES = Object.freeze(["disconnected", "running", "starting"]);

export const EndReason = Object.freeze({
  "USER": "user",
  "ADMIN": "admin",
  "CANCELLED": "cancelled",
  "QUEUE_TIMEOUT": "queue_timeout",
  "IDLE_TIMEOUT": "idle_timeout",
  "DISCONNECT_TIMEOUT": "disconnect_timeout",
  "MAX_DURATION": "max_duration",
  "HOST_LOST": "host_lost",
  "NODE_ENDED": "node_ended",
  "START_FAILED": "start_failed",
  "SCALE_IN": "scale_in",
  "STATE_LOST": "state_lost"
});

// ---- pools, hosts, principals ---------------------------------------------------------

export const HostState = Object.freeze({
  "UP": "up",
  "DRAINING": "draining",
  "DOWN": "down"
});

export const PlacementStrategy = Object.freeze({
  "BREADTH_FIRST": "breadth-first",
  "DEPTH_FIRST": "depth-first"
});

export const PoolKind = Object.freeze({
  "DESKTOP": "desktop",
  "GAME": "game"
});

export const Role = Object.freeze({
  "ADMIN": "admin",
  "NODE": "node",
  "USER": "user"
});

// ---- signaling (WebSocket {API_PREFIX}/sessions/{id}/signal) -----------------------------

export const SignalType = Object.freeze({
  "OFFER": "offer",
  "ANSWER": "answer",
  "CANDIDATE": "candidate",
  "BYE": "bye",
  "ERROR": "error",
  "PEER_JOINED": "peer_joined",
  "PEER_LEFT": "peer_left",
  "IN_USE": "in_use",
  "MOVED": "moved",
  "CONTROL": "control"
});

// `reason` of a `bye` the broker sends a viewer (besides session end reasons)
export const ByeReason = Object.freeze({
  "SHARE_REVOKED": "share_revoked"
});

// what a share link lets its viewer do
export const ShareRole = Object.freeze({
  "VIEW": "view"
});

export const SIGNAL_MAX_BYTES = 65536;

// `code` of a signaling error message
export const SignalError = Object.freeze({
  "BAD_SIGNAL": "bad_signal",
  "NOT_RUNNING": "not_running",
  "BAD_OFFER": "bad_offer",
  "BAD_SDP": "bad_sdp",
  "NO_VIDEO": "no_video",
  "NO_COMMON_CODEC": "no_common_codec",
  "NO_ENCODER": "no_encoder",
  "BAD_CANDIDATE": "bad_candidate",
  "ICE_FAILED": "ice_failed",
  "DTLS_FAILED": "dtls_failed",
  "NO_UDP_PORT": "no_udp_port"
});

// ---- data channel (viewer <-> node) ----------------------------------------------------

export const INPUT_CHANNEL_LABEL = "input";

export const PROBE_CHANNEL_LABEL = "probe";

export const InputType = Object.freeze({
  "POINTER_MOVE": "pm",
  "POINTER_RELATIVE": "pr",
  "POINTER_BUTTON": "pb",
  "WHEEL": "pw",
  "KEY": "k",
  "GAMEPAD": "gp",
  "CLIPBOARD": "cb",
  "TEXT": "tx",
  "RESIZE": "rs",
  "PING": "ping",
  "PROBE_ACK": "pa",
  "VIEWER_STATS": "vs"
});

export const NodeEventType = Object.freeze({
  "PONG": "pong",
  "CLIPBOARD": "cb",
  "CURSOR": "cur",
  "WARNING": "warn",
  "STATS": "stats",
  "PROBE": "probe"
});

// `controls` of a stats message: what the session's input does (null: nothing to show)
export const ControlScheme = Object.freeze({
  "BUILTIN_GAME": "builtin_game"
});

export const CLIPBOARD_MAX_CHARS = 65536;
export const GAMEPAD_MAX_AXES = 8;
export const GAMEPAD_MAX_BUTTONS = 17;
export const GAMEPAD_MAX_INDEX = 3;
export const POINTER_MAX_BUTTON = 5;
export const POINTER_MAX_DELTA = 4096;
export const WHEEL_MAX_NOTCHES = 10;
export const TEXT_MAX_CHARS = 256;
export const VIEWER_STATS_MAX_SAMPLES = 64;
export const VIEWER_STATS_INTERVAL_MS = 2000;

// ---- broker <-> node and event stream ----------------------------------------------------

export const NodeCommand = Object.freeze({
  "START": "start",
  "STOP": "stop",
  "WARN": "warn",
  "SIGNAL": "signal",
  "CONTROL": "control"
});

export const EventType = Object.freeze({
  "STATE": "state",
  "WARNING": "warning"
});
