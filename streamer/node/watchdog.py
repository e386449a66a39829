"""The node watchdog's policy: when a host is sick enough to drain, and when it may take sessions again.

Job: a pure function ``decide(state, sample, now_ms, limits) -> (Decision, WatchdogState)`` that the
agent calls once per heartbeat with what the node just measured (GPU telemetry, its session count,
its failed sessions, its own event-loop lag).  It never reads a clock, never awaits and does no I/O;
the agent applies the decision (``drain``/``undrain`` through the broker, with the decision's
``reason``, which the broker audits).

Rules (each a ``reason`` code in the decision):
- ``gpu_hot``: a GPU at or above ``max_temp_c``;
- ``gpu_throttled``: a GPU throttled by heat or power (``THROTTLE_SICK``) for ``throttle_hold_ms``;
- ``vram_leak``: a GPU's VRAM grew by ``vram_growth_mb`` while the session count did not change
  (a session or driver leaking, not new work);
- ``session_failures``: ``max_session_failures`` or more sessions failed to start or stream (capture or
  encoder gave up) since the last sample;
- ``encoder_errors``: ``max_encoder_errors`` or more encoder errors (frames the encoder raised on,
  encoders that failed to open) since the last sample, across the node's sessions: an encoder failing
  now and then, which never ends a session (that takes 30 failed frames in a row) but shows as
  dropped frames;
- ``loop_lag``: the node's event loop ran ``max_loop_lag_ms`` late (the node cannot serve its streams);
- ``selftest_failed``: the node's latest stream self-test failed (``streamer.node.selftest``: a corrupt
  frame, frames lost with no loss to explain them, no recovery after induced loss); a later passing
  run clears it.
A sick sample while healthy -> ``drain`` (a trip).  A drained host undrains after ``healthy_hold_ms``
of healthy samples, unless it tripped ``max_trips`` times within ``trip_window_ms``: then it stays
drained for an operator (``hold_for_operator``), because flapping hurts users more than a lost host.
``WatchdogState.tripped`` names the checks (``broker.protocol.WatchdogCheck``) that failed since the
watchdog drained the host (empty while it has not); the node reports them, and ``held``, in each
heartbeat.  ``released`` is the state after an operator undrained the host the watchdog held drained.

Invariants: only a host this watchdog drained is undrained by it; decisions carry the measured
figure in their reason; state is a frozen value (replayable in tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from broker.protocol import WatchdogCheck

Action = Literal["none", "drain", "undrain", "hold_for_operator"]
# Throttle reasons that mean heat or power trouble (streamer.node.gpus.THROTTLE_REASONS names);
# gpu_idle, applications_clocks, sync_boost and display_clocks are normal operation.
THROTTLE_SICK: Final = frozenset({"hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"})


@dataclass(frozen=True)
class Limits:
    """Thresholds; the node's settings fill them."""

    max_temp_c: float = 90.0
    throttle_hold_ms: int = 60_000
    vram_growth_mb: float = 2048.0
    max_session_failures: int = 3
    max_encoder_errors: int = 30  # per sample (heartbeat): a 60 fps stream failing 1 frame in 10 for 5 s
    max_loop_lag_ms: float = 1000.0
    healthy_hold_ms: int = 300_000
    max_trips: int = 3
    trip_window_ms: int = 3_600_000


@dataclass(frozen=True)
class Sample:
    """What the node measured at one heartbeat."""

    gpus: Sequence[Mapping[str, Any]]  # GpuTelemetry rows: index, temperature_c, throttle_reasons, vram_used_mb
    sessions: int
    session_failures: int  # cumulative: sessions that failed to start or whose capture/encoder gave up
    loop_lag_ms: float  # how late the node's event loop ran its last timer
    encoder_errors: int = 0  # cumulative: the node's encoder errors (its sessions' and self-tests')
    selftest_failure: str = ""  # why the latest stream self-test failed; "" = passed or never run


@dataclass(frozen=True)
class WatchdogState:
    drained: bool = False  # this watchdog drained the host
    held: bool = False  # tripped too often: stays drained until an operator acts
    healthy_since_ms: int | None = None
    trips_ms: tuple[int, ...] = ()
    throttled_since_ms: Mapping[int, int] = field(default_factory=dict)  # gpu index -> first throttled sample
    vram_base_mb: Mapping[int, float] = field(default_factory=dict)  # gpu index -> VRAM at the last session change
    sessions: int | None = None
    session_failures: int = 0
    encoder_errors: int = 0
    tripped: frozenset[WatchdogCheck] = frozenset()  # checks failed since this watchdog drained the host


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # "" for none; else "<code>: <what was measured>"


Problem = tuple[WatchdogCheck, str]  # (check, what was measured)


def _problems(state: WatchdogState, s: Sample, now_ms: int, lim: Limits) -> tuple[list[Problem], dict[int, int]]:
    out: list[Problem] = []
    throttled: dict[int, int] = {}
    for g in s.gpus:
        i = int(g["index"])
        temp = g.get("temperature_c")
        if temp is not None and temp >= lim.max_temp_c:
            out.append((WatchdogCheck.GPU_HOT, f"GPU {i} at {temp:g} C (limit {lim.max_temp_c:g} C)"))
        sick = sorted(THROTTLE_SICK.intersection(g.get("throttle_reasons") or ()))
        if sick:
            since = state.throttled_since_ms.get(i, now_ms)
            throttled[i] = since
            if now_ms - since >= lim.throttle_hold_ms:
                out.append((WatchdogCheck.GPU_THROTTLED, f"GPU {i} {','.join(sick)} for {(now_ms - since) / 1000:g} s"))
        used, base = g.get("vram_used_mb"), state.vram_base_mb.get(i)
        if used is not None and base is not None and state.sessions == s.sessions \
                and used - base >= lim.vram_growth_mb:
            out.append((WatchdogCheck.VRAM_LEAK,
                        f"GPU {i} VRAM +{used - base:.0f} MiB with {s.sessions} session(s) unchanged"))
    failed = 0 if state.sessions is None else s.session_failures - state.session_failures  # first sample: baseline
    if failed >= lim.max_session_failures:
        out.append((WatchdogCheck.SESSION_FAILURES, f"{failed} session(s) failed to start or stream"))
    errors = 0 if state.sessions is None else s.encoder_errors - state.encoder_errors  # first sample: baseline
    if errors >= lim.max_encoder_errors:
        out.append((WatchdogCheck.ENCODER_ERRORS, f"{errors} encoder error(s) since the last heartbeat (limit "
                                                  f"{lim.max_encoder_errors})"))
    if s.selftest_failure:
        out.append((WatchdogCheck.SELFTEST_FAILED, s.selftest_failure))
    if s.loop_lag_ms >= lim.max_loop_lag_ms:
        out.append((WatchdogCheck.LOOP_LAG,
                    f"event loop {s.loop_lag_ms:.0f} ms late (limit {lim.max_loop_lag_ms:g} ms)"))
    return out, throttled


def decide(state: WatchdogState, sample: Sample, now_ms: int, limits: Limits = Limits()) -> tuple[Decision,
                                                                                                 WatchdogState]:
    """One watchdog step (pure): the decision and the next state."""
    problems, throttled = _problems(state, sample, now_ms, limits)
    # VRAM baselines move with the session count: new work may use more memory
    if state.sessions != sample.sessions:
        base = {int(g["index"]): float(g["vram_used_mb"]) for g in sample.gpus if g.get("vram_used_mb") is not None}
    else:
        base = dict(state.vram_base_mb)
        for g in sample.gpus:
            if int(g["index"]) not in base and g.get("vram_used_mb") is not None:
                base[int(g["index"])] = float(g["vram_used_mb"])
    nxt = replace(state, throttled_since_ms=throttled, vram_base_mb=base, sessions=sample.sessions,
                  session_failures=sample.session_failures, encoder_errors=sample.encoder_errors)
    if problems:
        checks = frozenset(check for check, _ in problems)
        nxt = replace(nxt, healthy_since_ms=None)
        if state.drained or state.held:
            return Decision("none", ""), replace(nxt, tripped=state.tripped | checks)
        trips = (*(t for t in state.trips_ms if now_ms - t < limits.trip_window_ms), now_ms)
        return (Decision("drain", "; ".join(f"{check}: {what}" for check, what in problems)),
                replace(nxt, drained=True, trips_ms=trips, tripped=checks))
    if not state.drained or state.held:
        return Decision("none", ""), nxt
    since = state.healthy_since_ms if state.healthy_since_ms is not None else now_ms
    nxt = replace(nxt, healthy_since_ms=since)
    if now_ms - since < limits.healthy_hold_ms:
        return Decision("none", ""), nxt
    recent = [t for t in state.trips_ms if now_ms - t < limits.trip_window_ms]
    if len(recent) >= limits.max_trips:
        return (Decision("hold_for_operator", f"tripped {len(recent)} times in {limits.trip_window_ms / 60_000:g} "
                                              "min: stays drained until an operator undrains it"),
                replace(nxt, held=True))
    return (Decision("undrain", f"healthy for {(now_ms - since) / 1000:g} s"),
            replace(nxt, drained=False, healthy_since_ms=None, tripped=frozenset()))


def released(state: WatchdogState) -> WatchdogState:
    """The state once an operator undrained a host this watchdog had drained (held or not): nothing
    tripped, no trips remembered, so the next sick sample drains it again; the baselines stay."""
    return replace(state, drained=False, held=False, healthy_since_ms=None, trips_ms=(), tripped=frozenset())
