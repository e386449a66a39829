"""The autoscaling policy: a pool snapshot and the plan's current phase in, scaling decisions out.

Job: decide, once per evaluation (the service runs it every few minutes per pool), which hosts
to start, drain, undrain and stop, whose users to warn and whose sessions to end, and which
placement strategy the pool should use -- following Azure Virtual Desktop scaling plans
(`broker.autoscale.plans`).  ``decide(snapshot, now, plan, previous_state) -> (decisions, new_state)``;
the service layer applies the decisions (provider calls, Redis Lua steps) and logs each
decision's ``reason`` (a stable code) and ``detail`` (numbers, for humans).

The rules, per evaluation (T = the phase's capacity threshold, in percent):
  1. Available hosts are ``up`` ones (not draining, not down, not starting).  Used capacity =
     (sessions on available hosts + queued requests) / seats on available hosts.
  2. Scale out when used capacity > T: first undrain hosts this autoscaler drained (no boot
     delay, no new cost), then StartHosts(n) -- just enough that, counting hosts already
     starting or pending, used capacity would be <= T.  Never beyond ``max_hosts``.
  3. Minimum: keep ceil(min_hosts_pct * max_hosts / 100) hosts available or coming (undrain
     first, then start).
  4. Scale in (ramp-down and off-peak only; not in the same evaluation as a scale-out, not
     within ``scale_in_cooldown_min`` of the last scale-out, not while requests are queued):
     drain available hosts fewest-sessions-first while the remaining available hosts stay at
     or above the minimum and used capacity -- counting the drained host's sessions, whose
     users may come back -- stays <= T - ``scale_in_margin_pct`` (hysteresis: the band between
     the scale-in and scale-out lines stops flapping).  A host undrained within
     ``undrain_hold_min`` is not drained.
  5. A host this autoscaler drained is stopped once the snapshot shows it draining with zero
     sessions (Redis is the source of truth: a draining host receives no new sessions, so
     zero in a snapshot taken after the drain stays zero; a host drained in this very
     evaluation is therefore stopped at the next one, never in the same breath).
     With force-logoff (ramp-down/off-peak of a ``force_logoff`` schedule) its users are
     warned once (WarnSessions with ``ends_in_s``), and only after ``logoff_wait_min``
     minutes since that warning are their sessions ended (EndSessions, end reason
     ``scale_in``); outside a force-logoff phase pending warnings are dropped, so a later
     force-logoff always starts with a fresh warning.
  6. SetStrategy whenever the pool's placement strategy differs from the phase's.

Predictive mode (``plan.mode == "predictive"``; the phase thresholds, the scale-in phases, the
cooldown and the phase strategy are not used, the phase minimum and force-logoff settings are):
  P1. Actual demand = sessions on up and draining hosts + queued requests; capacity = seats on
      up, starting and pending hosts + sessions on draining hosts (they are served where they are).
  P2. The look-ahead L = ``predictive.boot_s`` + ``snapshot.interval_s``: hosts started now serve
      from one boot time on, and the next evaluation can start more.  The forecast
      (``snapshot.forecast``, fitted from the pool's history) gives the peak over [now, now + L],
      times the recent-error correction (`broker.autoscale.forecast.update_ratio`, updated here
      with the actual/forecast ratio of this evaluation and kept in state).  The live trend is
      actual demand plus its growth since the last evaluation extrapolated over L.  The target
      is ceil(max(forecast peak, live trend) * (1 + margin_pct / 100) + margin_seats) seats.
  P3. Below target: undrain hosts this autoscaler drained (most free seats first), then start
      ceil(missing seats / new host seats) hosts, never beyond ``max_hosts`` (reason
      ``forecast`` or ``actual``: whichever bound the target).  The phase minimum as in rule 3.
  P4. Above target (and nothing queued): stop empty up hosts -- Drain, then StopHost in the
      same evaluation (reason ``forecast_surplus``, then ``drained_empty``) -- while capacity
      without each one stays >= target and the phase minimum holds; a host undrained within
      ``undrain_hold_min`` is kept.  A host with sessions is never drained: its free seats
      would be lost while it still bills, and depth-first placement already sends new
      sessions to fuller hosts, so a lightly used host empties by itself.  The service's
      remove is atomic and refuses a host a session raced onto after the snapshot (it then
      stays drained and rule 5 stops it once empty, or P3 undrains it).
  P5. Placement is depth-first in every phase (packing is what lets hosts empty; it does not
      change whether a free seat exists, so it costs no wait).
  Every decision of P3/P4 carries ``facts``: forecast, correction ratio, live trend, actual,
  margin, target and capacity, for the decision log.

The autoscaler only undrains, warns, ends and stops hosts *it* drained (tracked in state):
a host an admin drained for maintenance is left alone and counts as unavailable.

Concurrency model: none.  `decide` is a pure function of its arguments: ``now`` is passed in
(aware datetime), nothing reads a clock, nothing does I/O.  Snapshots, decisions and states
are frozen values; the state round-trips through `AutoscaleState.to_dict`/`from_dict` so
the service can keep it in Redis between evaluations (any replica may run the next one).

Invariants (tests assert them):
  - StopHost is only ever issued for a host with 0 sessions in the snapshot that is ``draining``
    there or (predictive mode) drained by a Drain just before it in the same decisions.
  - EndSessions is only issued for a host whose users were warned >= logoff_wait_min ago.
  - StartHosts never takes hosts on (up + draining + starting + pending) above ``max_hosts``.
  - No Drain in an evaluation that scales out, nor (reactive) within the cooldown after one;
    a predictive Drain is only of an up host with 0 sessions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from broker.autoscale.forecast import DemandForecast, update_ratio
from broker.autoscale.plans import PredictiveSettings, ScalingPlan, phase_at
from broker.models import PoolConfig
from broker.placement import HostLoad
from broker.protocol import EndReason, HostState, PlacementStrategy

HOST_STARTING: Final = "starting"  # booting: requested from the provider, not yet registered up
HOST_STATES: Final = (HostState.UP.value, HostState.DRAINING.value, HostState.DOWN.value, HOST_STARTING)
_UP: Final = HostState.UP.value
_DRAINING: Final = HostState.DRAINING.value
_EPS: Final = 1e-9  # float slack for percent arithmetic (10 % of 6 hosts is 0.6000000000000001)


class Reason(StrEnum):
    """Stable reason codes carried by every decision."""

    ABOVE_THRESHOLD = "above_threshold"  # StartHosts / Undrain: used capacity > phase threshold
    BELOW_MIN_HOSTS = "below_min_hosts"  # StartHosts / Undrain: fewer hosts than the phase minimum
    SCALE_IN = "scale_in"  # Drain: capacity stays under threshold - margin without this host
    DRAINED_EMPTY = "drained_empty"  # StopHost: a host we drained has no session left
    FORCE_LOGOFF_WARNING = "force_logoff_warning"  # WarnSessions: users told their session ends
    FORCE_LOGOFF = "force_logoff"  # EndSessions: the announced wait is over
    PHASE_STRATEGY = "phase_strategy"  # SetStrategy: the phase uses another placement strategy
    FORECAST = "forecast"  # StartHosts / Undrain (predictive): forecast demand + margin above capacity
    ACTUAL = "actual"  # StartHosts / Undrain (predictive): live demand and its trend + margin above capacity
    FORECAST_SURPLUS = "forecast_surplus"  # Drain (predictive): an empty host capacity stays >= target without
    PREDICTIVE_STRATEGY = "predictive_strategy"  # SetStrategy: predictive plans pack depth-first


Facts = tuple[tuple[str, float], ...]  # numbers behind a decision, for the decision log (name, value)


# --- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSnapshot:
    """One host as the autoscaler sees it: state is up, draining, down or starting."""

    host_id: str
    state: str
    sessions: int
    seats: int

    @property
    def free(self) -> int:
        return max(0, self.seats - self.sessions)

    @classmethod
    def from_load(cls, load: HostLoad) -> HostSnapshot:
        return cls(load.host_id, load.state, load.used, load.seats)


@dataclass(frozen=True)
class PoolSnapshot:
    """A pool at one instant: config, hosts, hosts requested but not yet registered, queue length.

    ``max_hosts`` is the most hosts the provider may run for this pool; minimum percentages are
    taken of it.  ``new_host_seats`` is what a freshly started host offers (0: the largest
    seat count among known hosts, or 1 when none is known).  ``interval_s`` is the time to the
    next evaluation and ``forecast`` the pool's demand forecast (None: no history yet); both are
    used by predictive plans only.
    """

    pool: PoolConfig
    hosts: tuple[HostSnapshot, ...]
    max_hosts: int
    pending_starts: int = 0
    queued: int = 0
    new_host_seats: int = 0
    interval_s: float = 300.0
    forecast: DemandForecast | None = None


# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartHosts:
    count: int
    reason: str
    detail: str = ""
    facts: Facts = ()


@dataclass(frozen=True)
class Drain:
    host_id: str
    reason: str
    detail: str = ""
    facts: Facts = ()


@dataclass(frozen=True)
class Undrain:
    host_id: str
    reason: str
    detail: str = ""
    facts: Facts = ()


@dataclass(frozen=True)
class StopHost:
    """Stop (deprovision) a drained host that has no session."""

    host_id: str
    reason: str
    detail: str = ""
    facts: Facts = ()


@dataclass(frozen=True)
class WarnSessions:
    """Warn every user on ``host_id`` that their session ends in ``ends_in_s`` seconds."""

    host_id: str
    ends_in_s: int
    message: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class EndSessions:
    """End every session on ``host_id`` with ``end_reason`` (force-logoff after the warning)."""

    host_id: str
    reason: str
    detail: str = ""
    end_reason: str = EndReason.SCALE_IN.value


@dataclass(frozen=True)
class SetStrategy:
    strategy: str
    reason: str
    detail: str = ""


Decision = StartHosts | Drain | Undrain | StopHost | WarnSessions | EndSessions | SetStrategy


# --- state ----------------------------------------------------------------------------------


def _frozen(d: Mapping[str, float] | None = None) -> Mapping[str, float]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class AutoscaleState:
    """What the autoscaler remembers between evaluations (timestamps are epoch seconds)."""

    phase: str = ""
    last_scale_out_s: float | None = None
    last_scale_in_s: float | None = None
    drained: Mapping[str, float] = field(default_factory=_frozen)  # host -> when we drained it
    warned: Mapping[str, float] = field(default_factory=_frozen)  # host -> when its users were warned
    undrained: Mapping[str, float] = field(default_factory=_frozen)  # host -> when we undrained it
    forecast_ratio: float = 1.0  # predictive: recent actual / forecast demand (the error correction)
    last_demand: float | None = None  # predictive: actual demand at the last evaluation
    last_demand_s: float | None = None  # ... and when

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "last_scale_out_s": self.last_scale_out_s,
                "last_scale_in_s": self.last_scale_in_s, "drained": dict(self.drained),
                "warned": dict(self.warned), "undrained": dict(self.undrained),
                "forecast_ratio": self.forecast_ratio, "last_demand": self.last_demand,
                "last_demand_s": self.last_demand_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoscaleState:
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        def mapping(v: Any) -> Mapping[str, float]:
            return _frozen({str(k): float(x) for k, x in (v or {}).items()})

        return cls(phase=str(data.get("phase", "")), last_scale_out_s=opt(data.get("last_scale_out_s")),
                   last_scale_in_s=opt(data.get("last_scale_in_s")), drained=mapping(data.get("drained")),
                   warned=mapping(data.get("warned")), undrained=mapping(data.get("undrained")),
                   forecast_ratio=float(data.get("forecast_ratio", 1.0)), last_demand=opt(data.get("last_demand")),
                   last_demand_s=opt(data.get("last_demand_s")))


# --- arithmetic -----------------------------------------------------------------------------


def min_hosts(min_hosts_pct: float, total_hosts: int) -> int:
    """Hosts a phase keeps available: ceil(pct * total / 100), e.g. 10 % of 6 -> 1, 20 % of 6 -> 2."""
    return max(0, math.ceil(min_hosts_pct * total_hosts / 100.0 - _EPS))


def used_pct(demand: int, seats: int) -> float:
    """Used capacity in percent; no seats with demand is infinitely over, no demand is 0 %."""
    if seats <= 0:
        return math.inf if demand > 0 else 0.0
    return 100.0 * demand / seats


def seats_for(demand: int, threshold_pct: float) -> int:
    """Fewest seats that keep ``demand`` at or under ``threshold_pct``."""
    if demand <= 0:
        return 0
    return math.ceil(demand * 100.0 / threshold_pct - _EPS)


# --- predictive sizing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """What a predictive evaluation sized the pool for (sessions and seats)."""

    actual: int  # sessions on hosts + queued requests now
    capacity: int  # seats on up, starting and pending hosts + sessions on draining hosts
    lookahead_s: float
    forecast: float | None  # corrected forecast peak over [now, now + lookahead]; None without a forecast
    ratio: float  # the recent-error correction applied
    trend: float  # actual demand extrapolated over the look-ahead
    margin_pct: float
    margin_seats: int
    target: int  # seats wanted

    @property
    def bound(self) -> Reason:
        return Reason.FORECAST if self.forecast is not None and self.forecast >= self.trend else Reason.ACTUAL

    def facts(self) -> Facts:
        out: list[tuple[str, float]] = [("actual", self.actual), ("capacity", self.capacity),
                                        ("lookahead_s", self.lookahead_s)]
        if self.forecast is not None:
            out += [("forecast", round(self.forecast, 1)), ("correction", round(self.ratio, 3))]
        out += [("trend", round(self.trend, 1)), ("margin_pct", self.margin_pct),
                ("margin_seats", self.margin_seats), ("target", self.target)]
        return tuple(out)

    def text(self) -> str:
        fc = (f"forecast {self.forecast:.0f} (x{self.ratio:.2f} correction)" if self.forecast is not None
              else "no forecast")
        return (f"{fc} and trend {self.trend:.0f} over {self.lookahead_s:.0f} s, actual {self.actual}; margin "
                f"{self.margin_pct:g}% + {self.margin_seats} -> target {self.target} seats, capacity {self.capacity}")


def size_pool(settings: PredictiveSettings, forecast: DemandForecast | None, t: float, interval_s: float,
              actual: int, capacity: int, previous: AutoscaleState) -> tuple[Sizing, float]:
    """Rule P2: the seats to have within the look-ahead, and the updated correction ratio."""
    lookahead = settings.boot_s + interval_s
    ratio = previous.forecast_ratio
    peak: float | None = None
    if forecast is not None:
        ratio = update_ratio(ratio, actual, forecast.at(t), forecast.pseudo_count)
        peak = forecast.peak(t, t + lookahead) * ratio
    trend = float(actual)
    last, last_s = previous.last_demand, previous.last_demand_s
    if last is not None and last_s is not None and 0 < t - last_s <= 3 * interval_s:
        trend += max(0.0, (actual - last) / (t - last_s)) * lookahead
    basis = max(trend, peak if peak is not None else 0.0)
    target = math.ceil(basis * (1 + settings.margin_pct / 100.0) + settings.margin_seats - _EPS)
    sizing = Sizing(actual, capacity, lookahead, peak, ratio, trend, settings.margin_pct, settings.margin_seats,
                    max(0, target))
    return sizing, ratio


# --- the policy -----------------------------------------------------------------------------


def decide(snapshot: PoolSnapshot, now: datetime, plan: ScalingPlan,
           previous: AutoscaleState) -> tuple[tuple[Decision, ...], AutoscaleState]:
    """One autoscaler evaluation for one pool (see the module docstring for the rules)."""
    t = now.timestamp()
    phase = phase_at(plan, now)
    threshold = phase.capacity_threshold_pct
    decisions: list[Decision] = []

    up: list[HostSnapshot] = []
    ours: list[HostSnapshot] = []  # draining hosts this autoscaler drained
    n_draining = n_starting = 0
    seats = demand = coming_seats = draining_sessions = 0
    for h in snapshot.hosts:
        st = h.state
        if st == _UP:
            up.append(h)
            seats += h.seats
            demand += h.sessions
        elif st == _DRAINING:
            n_draining += 1
            draining_sessions += h.sessions
            if h.host_id in previous.drained:
                ours.append(h)
        elif st == HOST_STARTING:
            n_starting += 1
            coming_seats += h.seats
    up_ids = {h.host_id for h in up} if previous.undrained else set()
    drained = {h.host_id: previous.drained[h.host_id] for h in ours}
    warned = {k: v for k, v in previous.warned.items() if k in drained}
    hold_s = plan.undrain_hold_min * 60.0
    undrained = {k: v for k, v in previous.undrained.items() if k in up_ids and t - v < hold_s}

    predictive = plan.is_predictive
    strategy = PlacementStrategy.DEPTH_FIRST.value if predictive else phase.strategy
    if snapshot.pool.strategy != strategy:
        decisions.append(SetStrategy(strategy, Reason.PREDICTIVE_STRATEGY, "predictive plans pack depth-first")
                         if predictive else
                         SetStrategy(strategy, Reason.PHASE_STRATEGY,
                                     f"{phase.name} uses {phase.strategy} (pool has {snapshot.pool.strategy})"))

    new_seats = snapshot.new_host_seats or max((h.seats for h in snapshot.hosts), default=1) or 1
    demand += snapshot.queued
    coming_seats += snapshot.pending_starts * new_seats
    n_coming = len(up) + n_starting + snapshot.pending_starts  # available now or soon
    n_on = len(up) + n_draining + n_starting + snapshot.pending_starts  # what the provider runs
    floor_hosts = min(min_hosts(phase.min_hosts_pct, snapshot.max_hosts), snapshot.max_hosts)
    used = used_pct(demand, seats)
    spare = sorted(ours, key=lambda h: (-h.free, h.host_id))

    # --- scale out: capacity, then minimum; undrain before starting ---------------------------
    undrain_now: list[tuple[HostSnapshot, Reason]] = []
    sizing: Sizing | None = None
    ratio = previous.forecast_ratio
    if predictive:
        actual = demand + draining_sessions
        sizing, ratio = size_pool(plan.predictive, snapshot.forecast, t, snapshot.interval_s, actual,
                                  seats + coming_seats + draining_sessions, previous)
        missing = sizing.target - sizing.capacity
        for h in spare:
            if missing <= 0:
                break
            if h.free > 0:
                undrain_now.append((h, sizing.bound))
                missing -= h.free
        n_start_capacity = math.ceil(max(0, missing) / new_seats)
    else:
        need_seats = seats_for(demand, threshold) - (seats + coming_seats) if used > threshold + _EPS else 0
        for h in spare:
            if need_seats <= 0:
                break
            if h.sessions * 100.0 >= threshold * h.seats:  # undraining it would not lower used capacity
                continue
            undrain_now.append((h, Reason.ABOVE_THRESHOLD))
            seats += h.seats
            demand += h.sessions
            need_seats = seats_for(demand, threshold) - (seats + coming_seats)
        n_start_capacity = math.ceil(max(0, need_seats) / new_seats)
    facts = sizing.facts() if sizing is not None else ()
    chosen = {h.host_id for h, _ in undrain_now}
    for h in spare:
        if n_coming + len(undrain_now) + n_start_capacity >= floor_hosts:
            break
        if h.host_id not in chosen:
            undrain_now.append((h, Reason.BELOW_MIN_HOSTS))
            chosen.add(h.host_id)
    n_start_min = max(0, floor_hosts - (n_coming + len(undrain_now) + n_start_capacity))
    why_text = (f"{phase.name} (predictive): {sizing.text()}" if sizing is not None else
                f"{phase.name}: used {used:.1f}% vs threshold {threshold:g}%")
    for h, why in undrain_now:
        decisions.append(Undrain(h.host_id, why, f"{why_text}, {len(up)} available, minimum {floor_hosts}; "
                                                 f"undrain ({h.sessions}/{h.seats})", facts))
        undrained[h.host_id] = t
        drained.pop(h.host_id, None)
        warned.pop(h.host_id, None)
    headroom = max(0, snapshot.max_hosts - n_on)
    n_start = min(headroom, n_start_capacity + n_start_min)
    if n_start > 0:
        if sizing is not None:
            why = sizing.bound if n_start_capacity > 0 else Reason.BELOW_MIN_HOSTS
            text = f"{why_text}; {n_start} x {new_seats} seats; minimum {floor_hosts} hosts; cap {snapshot.max_hosts}"
        else:
            why = Reason.ABOVE_THRESHOLD if n_start_capacity > 0 else Reason.BELOW_MIN_HOSTS
            text = (f"{phase.name}: used {used:.1f}% (demand {demand}, {seats} seats available, {coming_seats} "
                    f"coming) vs threshold {threshold:g}%; minimum {floor_hosts} hosts; cap {snapshot.max_hosts}")
        decisions.append(StartHosts(n_start, why, text, facts))
    scaled_out = bool(undrain_now) or n_start > 0
    last_out = t if scaled_out else previous.last_scale_out_s

    # --- scale in ------------------------------------------------------------------------------
    drain_now: list[HostSnapshot] = []
    n_left = len(up)
    if sizing is not None:  # predictive: drain while capacity stays at or above the target
        surplus = sizing.capacity - sizing.target
        if not scaled_out and snapshot.queued == 0 and surplus > 0:
            for h in sorted((h for h in up if h.sessions == 0), key=lambda h: h.host_id):
                if n_left - 1 < floor_hosts:
                    break
                if h.host_id in undrained or h.seats > surplus:
                    continue
                drain_now.append(h)
                n_left -= 1
                surplus -= h.seats
                decisions.append(Drain(h.host_id, Reason.FORECAST_SURPLUS,
                                       f"{why_text}; empty, capacity after {sizing.target + surplus} >= target; "
                                       f"{n_left} available >= minimum {floor_hosts}", facts))
                decisions.append(StopHost(h.host_id, Reason.DRAINED_EMPTY,  # rule P4: stopped in the same breath
                                          f"{phase.name} (predictive): drained and empty", facts))
                drained[h.host_id] = t
    else:  # reactive: drain fewest-sessions-first while it stays under threshold - margin
        cooled = last_out is None or t - last_out >= plan.scale_in_cooldown_min * 60.0
        if phase.scale_in and not scaled_out and cooled and snapshot.queued == 0:
            line = max(0.0, threshold - plan.scale_in_margin_pct)
            seats_left = seats
            for h in sorted(up, key=lambda h: (h.sessions, h.host_id)):
                if n_left - 1 < floor_hosts:
                    break
                if h.host_id in undrained:
                    continue
                after = used_pct(demand, seats_left - h.seats)
                if after > line + _EPS:
                    continue
                drain_now.append(h)
                n_left -= 1
                seats_left -= h.seats
                decisions.append(Drain(h.host_id, Reason.SCALE_IN,
                                       f"{phase.name}: {h.sessions} sessions; used after {after:.1f}% <= "
                                       f"{line:g}% (threshold {threshold:g}% - margin {plan.scale_in_margin_pct:g}); "
                                       f"{n_left} available >= minimum {floor_hosts}"))
                drained[h.host_id] = t

    # --- drained hosts: stop when empty, or warn then force logoff ------------------------------
    wait_s = phase.logoff_wait_min * 60
    for h in sorted(ours, key=lambda h: h.host_id):
        if h.host_id in chosen:
            continue
        if h.sessions == 0:
            decisions.append(StopHost(h.host_id, Reason.DRAINED_EMPTY, f"{phase.name}: drained and empty", facts))
        elif not phase.force_logoff:
            warned.pop(h.host_id, None)
        elif h.host_id not in warned:
            decisions.append(WarnSessions(h.host_id, wait_s, phase.logoff_message, Reason.FORCE_LOGOFF_WARNING,
                                          f"{phase.name}: {h.sessions} sessions end in {phase.logoff_wait_min} min"))
            warned[h.host_id] = t
        elif t - warned[h.host_id] >= wait_s:
            decisions.append(EndSessions(h.host_id, Reason.FORCE_LOGOFF,
                                         f"{phase.name}: warned {t - warned[h.host_id]:.0f} s ago "
                                         f"(wait {wait_s} s); ending {h.sessions} sessions"))
    if phase.force_logoff:
        for h in drain_now:
            if h.sessions > 0:
                decisions.append(WarnSessions(h.host_id, wait_s, phase.logoff_message, Reason.FORCE_LOGOFF_WARNING,
                                              f"{phase.name}: {h.sessions} sessions end in "
                                              f"{phase.logoff_wait_min} min"))
                warned[h.host_id] = t

    state = AutoscaleState(
        phase=phase.name.value,
        last_scale_out_s=last_out,
        last_scale_in_s=t if drain_now else previous.last_scale_in_s,
        drained=_frozen(drained), warned=_frozen(warned), undrained=_frozen(undrained),
        forecast_ratio=ratio,
        last_demand=float(sizing.actual) if sizing is not None else previous.last_demand,
        last_demand_s=t if sizing is not None else previous.last_demand_s,
    )
    return tuple(decisions), state
