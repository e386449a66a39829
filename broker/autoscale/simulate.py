"""Pool sizing: replay demand through the real placement and autoscaling policies, on a simulated clock.

Job: answer "what does this scaling plan cost, and how long do users wait?" before a plan goes
live.  A discrete-event simulator (a heapq of events, the clock in seconds since ``start``)
replays session arrivals -- from history (`demand_from_history`, the lead feeds SQL rows) or
from a synthetic weekly curve (`synthetic_demand`: weekday/weekend diurnal shape, seeded RNG,
Poisson arrivals with a time-varying rate, log-normal durations) -- through:

  - placement: the same rule as `broker.placement.place` (breadth-first / depth-first over up
    hosts, GPU with the fewest used seats).  `place` is O(hosts) per call, so the simulator
    keeps `Fleet`, an incremental index (one lazy min-heap of host indices per used-seat
    count) that returns exactly what `place` would (``check_placement=True`` asserts it on every
    arrival; the tests also compare both on random operation sequences);
  - autoscaling: `broker.autoscale.policy.decide`, evaluated every ``tick_s`` simulated seconds, its
    decisions applied as the service would: StartHosts boots down hosts that come up after
    ``boot_delay_s``; Drain/Undrain flip a host's state; StopHost stops an empty drained host;
    EndSessions ends the sessions on a host (counted as force-ended); SetStrategy switches
    placement.  A predictive plan gets the forecast passed to `simulate` and ``tick_s`` as its
    interval in every snapshot, as the service gives it the pool's forecast and its interval.
  - the queue: FIFO; a request that finds no free seat waits; it abandons after the pool's
    ``queue_timeout_s``; with ``max_queue`` requests already waiting it is rejected.

Reported (`SimResult`): host-hours (a host is billed from its start request until it stops,
boot included), cost at ``price_per_host_hour``, peak concurrency, queue-wait p50/p95/p99
(nearest rank, over served and abandoned requests), the share of requests that waited over
60 s -- counting abandoned and rejected ones as failures too -- and sessions force-ended.
`compare` runs several plans on one demand; ``plan=None`` means always-on: every host up,
no autoscaler.  `recommend` searches plan parameters for the cheapest plan meeting a wait
target: a coarse pass over joint aggressiveness levels (binary search), then a coordinate
refinement of each parameter, each candidate simulation aborting as soon as it is known to
miss the target.  The perfect-foresight yardsticks (packing oracle, lower bound) are in
`broker.autoscale.oracle`, surprise weeks in `broker.autoscale.scenarios`.

Concurrency model: none.  Single-threaded and pure apart from `main` (argparse and printing):
no clock reads (simulated time only; benchmarks time runs themselves), no I/O, and the only
randomness is a `random.Random(seed)` passed around, so a seed reproduces a run exactly.

Invariants: a seat is never double-booked (Fleet counts per GPU); every placement equals what
`place` returns for the same hosts; every scaling action comes from `decide`; host-hours never
exceed hosts * simulated hours.

Size: about 760 lines on purpose: the event loop, the incremental placement index it must keep in step
with `broker.placement.place` (``check_placement``) and the recommendation search that drives the loop
share the simulated fleet's internals; demand scenarios live in `broker.autoscale.scenarios`.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from broker.autoscale.forecast import DemandForecast
from broker.autoscale.oracle import lower_bound, packing_oracle
from broker.autoscale.plans import DEFAULT_PLAN, PhaseSettings, ScalingPlan, phase_at
from broker.autoscale.policy import (
    HOST_STARTING,
    AutoscaleState,
    Drain,
    EndSessions,
    HostSnapshot,
    PoolSnapshot,
    SetStrategy,
    StartHosts,
    StopHost,
    Undrain,
    WarnSessions,
    decide,
    min_hosts,
)
from broker.models import PoolConfig
from broker.placement import GpuLoad, HostLoad, place
from broker.protocol import HostState, PlacementStrategy

DAY_S: Final = 86_400
WEEK_S: Final = 7 * DAY_S
WAIT_TARGET_S: Final = 60.0  # "waited over a minute" is the service-level line
DEFAULT_START: Final = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday, 00:00 UTC

_UP: Final = HostState.UP.value
_DRAINING: Final = HostState.DRAINING.value
_DOWN: Final = HostState.DOWN.value

# Event kinds; at equal times they run in this order (a seat freed at t serves a request
# whose queue deadline is t; an arrival at t sees hosts that came up at t).
_END, _HOST_UP, _TICK, _ARRIVAL, _ABANDON = 0, 1, 2, 3, 4

# Session status codes (a bytearray per run).
_PENDING, _QUEUED, _RUNNING, _DONE, _ABANDONED, _REJECTED, _FORCE_ENDED = range(7)


# --- demand ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    """One session request: when (seconds after the simulation start) and how long it would run."""

    at_s: float
    duration_s: float


# Fraction of peak demand by local hour (piecewise-linear between knots).
WEEKDAY_SHAPE: Final = ((0, 0.06), (5, 0.04), (6, 0.08), (7, 0.25), (8, 0.65), (9, 0.95), (11, 1.0),
                        (12, 0.85), (13, 0.95), (15, 1.0), (17, 0.8), (18, 0.5), (19, 0.3), (21, 0.2),
                        (23, 0.1), (24, 0.06))
WEEKEND_SHAPE: Final = ((0, 0.06), (8, 0.05), (10, 0.2), (13, 0.35), (16, 0.35), (19, 0.25), (22, 0.15),
                        (24, 0.06))


def _interp(knots: Sequence[tuple[float, float]], hour: float) -> float:
    xs = [k[0] for k in knots]
    j = max(1, min(len(knots) - 1, bisect.bisect_right(xs, hour)))
    (x0, y0), (x1, y1) = knots[j - 1], knots[j]
    return y0 + (y1 - y0) * (hour - x0) / (x1 - x0)


def weekly_shape(t_s: float, start_weekday: int = 0) -> float:
    """Demand as a fraction of peak at ``t_s`` seconds after a local midnight on ``start_weekday``."""
    day, sec = divmod(t_s, DAY_S)
    weekday = (start_weekday + int(day)) % 7
    return _interp(WEEKEND_SHAPE if weekday >= 5 else WEEKDAY_SHAPE, sec / 3600.0)


def synthetic_demand(peak_concurrency: int, days: float = 7.0, *, seed: int = 0, mean_duration_s: float = 3600.0,
                     duration_sigma: float = 0.8, start_weekday: int = 0,
                     max_duration_s: float = 8 * 3600.0,
                     shape: Callable[[float], float] | None = None) -> tuple[Arrival, ...]:
    """Poisson arrivals whose rate follows `weekly_shape`, scaled so concurrency peaks near ``peak_concurrency``.

    ``shape`` replaces `weekly_shape`: demand as a fraction of peak at t seconds after the start
    (`broker.autoscale.scenarios` builds surprise weeks this way).

    By Little's law concurrency ~ rate * mean duration, so the rate at shape 1.0 is
    peak / mean duration.  The rate is constant within each simulated minute (its value at
    the minute's midpoint) and arrivals are drawn exactly for that piecewise-constant rate.
    Durations are log-normal with the given mean and sigma, clipped to [60 s, max_duration_s].
    """
    rng = random.Random(seed)
    peak_rate = peak_concurrency / mean_duration_s  # arrivals per second at shape 1.0
    minutes = math.ceil(days * DAY_S / 60)
    curve = shape if shape is not None else (lambda t: weekly_shape(t, start_weekday))
    rates = [peak_rate * max(0.0, curve(m * 60 + 30)) for m in range(minutes)]
    mu = math.log(mean_duration_s) - duration_sigma ** 2 / 2
    out: list[Arrival] = []
    t = 0.0
    m = 0
    mass = rng.expovariate(1.0)  # unit-rate exponential: the integrated rate until the next arrival
    while m < minutes:
        rate = rates[m]
        end = (m + 1) * 60.0
        left = (end - t) * rate
        if rate <= 0 or mass > left:
            mass -= max(0.0, left)
            t = end
            m += 1
            continue
        t += mass / rate
        duration = min(max_duration_s, max(60.0, rng.lognormvariate(mu, duration_sigma)))
        out.append(Arrival(t, duration))
        mass = rng.expovariate(1.0)
    return tuple(out)


def demand_from_history(sessions: Iterable[tuple[datetime, float]], start: datetime) -> tuple[Arrival, ...]:
    """(requested_at, duration_s) rows -> arrivals relative to ``start`` (rows before it are dropped)."""
    out = [Arrival((at - start).total_seconds(), max(1.0, float(d))) for at, d in sessions]
    return tuple(sorted((a for a in out if a.at_s >= 0), key=lambda a: a.at_s))


# --- configuration and results -----------------------------------------------------------------


@dataclass(frozen=True)
class SimConfig:
    """The simulated pool: ``hosts`` identical hosts (the provider's maximum), prices, delays."""

    pool: PoolConfig
    hosts: int
    seats_per_host: int
    gpus_per_host: int = 1
    start: datetime = DEFAULT_START
    days: float = 7.0
    tick_s: int = 300  # autoscaler evaluation period
    boot_delay_s: int = 300  # StartHosts -> host up
    price_per_host_hour: float = 1.0
    initial_hosts: int | None = None  # hosts up at t=0 under a plan; None: the phase minimum


@dataclass(frozen=True)
class SimResult:
    label: str
    host_hours: float
    cost: float
    arrivals: int
    served: int
    abandoned: int
    rejected: int
    peak_concurrency: int
    peak_hosts_on: int
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    waited_over_60s_pct: float  # (served after > 60 s + abandoned + rejected) / arrivals
    force_ended: int
    actions: int  # autoscaler decisions applied (starts count once per decision)
    aborted: bool = False  # stopped early: already known to miss the wait target

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values) - 1e-9))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


# --- the seat index -------------------------------------------------------------------------


class Fleet:
    """Hosts of one simulated pool with an incremental placement index equal to `place`.

    ``buckets[u]`` is a min-heap of indices of hosts that had ``u`` used seats (< seats) while up
    when pushed; stale entries (the host's count or state changed since) are dropped lazily when
    they reach the top.  Host ids are zero-padded so index order is host-id order, which makes
    "lowest index in the lowest (breadth) or highest (depth) non-empty bucket" exactly `place`'s
    tie-breaking for identical hosts.  Mutable, owned by one simulation run.
    """

    def __init__(self, n_hosts: int, gpus_per_host: int, seats_per_gpu: int) -> None:
        width = max(5, len(str(max(0, n_hosts - 1))))
        self.ids = [f"h{i:0{width}d}" for i in range(n_hosts)]
        self.by_id = {h: i for i, h in enumerate(self.ids)}
        self.gpus = gpus_per_host
        self.seats_per_gpu = seats_per_gpu
        self.seats = gpus_per_host * seats_per_gpu
        self.state = [_DOWN] * n_hosts
        self.used = [0] * n_hosts
        self.gpu_used = [[0] * gpus_per_host for _ in range(n_hosts)]
        self.sessions: list[set[int]] = [set() for _ in range(n_hosts)]
        self.dirty: set[int] = set()  # hosts whose state or count changed since the caller last cleared it
        self._buckets: list[list[int]] = [[] for _ in range(self.seats)]
        self._entries = 0

    def _push(self, i: int) -> None:
        self.dirty.add(i)
        u = self.used[i]
        if self.state[i] == _UP and u < self.seats:
            heapq.heappush(self._buckets[u], i)
            self._entries += 1
            if self._entries > 4 * len(self.ids) + 64:
                self._rebuild()

    def _rebuild(self) -> None:
        self._buckets = [[] for _ in range(self.seats)]
        for i, st in enumerate(self.state):
            if st == _UP and self.used[i] < self.seats:
                self._buckets[self.used[i]].append(i)
        for b in self._buckets:
            heapq.heapify(b)
        self._entries = sum(len(b) for b in self._buckets)

    def set_state(self, i: int, state: str) -> None:
        self.state[i] = state
        self._push(i)

    def pick(self, strategy: str) -> tuple[int, int] | None:
        """(host index, GPU index) that `place` would choose, or None when no up host has a free seat."""
        order = range(self.seats - 1, -1, -1) if strategy == PlacementStrategy.DEPTH_FIRST else range(self.seats)
        state, used = self.state, self.used
        for u in order:
            b = self._buckets[u]
            while b:
                i = b[0]
                if state[i] == _UP and used[i] == u:
                    if self.gpus == 1:
                        return i, 0
                    g_used = self.gpu_used[i]
                    return i, min(range(self.gpus), key=lambda k: (g_used[k], k))
                heapq.heappop(b)
                self._entries -= 1
        return None

    def seat(self, i: int, g: int, sid: int) -> None:
        self.gpu_used[i][g] += 1
        self.used[i] += 1
        self.sessions[i].add(sid)
        self._push(i)

    def unseat(self, i: int, g: int, sid: int) -> None:
        self.gpu_used[i][g] -= 1
        self.used[i] -= 1
        self.sessions[i].discard(sid)
        self._push(i)

    def loads(self) -> list[HostLoad]:
        """Every host as `broker.placement` sees it (starting hosts are not up, so never chosen)."""
        return [HostLoad(self.ids[i], self.state[i],
                         tuple(GpuLoad(k, self.seats_per_gpu, self.gpu_used[i][k]) for k in range(self.gpus)))
                for i in range(len(self.ids))]


# --- the simulation -------------------------------------------------------------------------


def simulate(demand: Sequence[Arrival], config: SimConfig, plan: ScalingPlan | None, *, label: str = "",
             abort_over_60s: int | None = None, check_placement: bool = False,
             forecast: DemandForecast | None = None) -> SimResult:
    """Replay ``demand`` on ``config``'s pool under ``plan`` (None: always-on, every host up).

    ``forecast``: the demand forecast a predictive plan sizes the pool with (fitted on history
    before ``config.start``; None: the plan sizes on live demand only).

    ``abort_over_60s``: stop as soon as more requests than this have waited over 60 s (or were
    abandoned/rejected); the result is then partial and marked ``aborted``.
    ``check_placement``: assert every placement equals `broker.placement.place` (slow; tests).
    """
    if config.seats_per_host % config.gpus_per_host:
        raise ValueError("seats_per_host must be a multiple of gpus_per_host")
    n = config.hosts
    fleet = Fleet(n, config.gpus_per_host, config.seats_per_host // config.gpus_per_host)
    horizon = config.days * DAY_S
    pool = config.pool
    queue_timeout = float(pool.queue_timeout_s)

    host_seconds = 0.0
    on_since: list[float | None] = [None] * n
    hosts_on = 0
    peak_hosts_on = 0
    down_heap: list[int] = []

    def power_on(i: int, t: float, state: str) -> None:
        nonlocal hosts_on, peak_hosts_on
        on_since[i] = t
        hosts_on += 1
        peak_hosts_on = max(peak_hosts_on, hosts_on)
        fleet.set_state(i, state)

    if plan is None:
        strategy = pool.strategy
        initial = n
    else:
        phase0 = phase_at(plan, config.start)
        strategy = phase0.strategy
        initial = config.initial_hosts if config.initial_hosts is not None else min_hosts(phase0.min_hosts_pct, n)
    for i in range(n):
        if i < initial:
            power_on(i, 0.0, _UP)
        else:
            down_heap.append(i)

    events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, arg)
    seq = 0

    def push(t: float, kind: int, arg: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, arg))

    if plan is not None:
        push(0.0, _TICK, 0)

    n_arr = len(demand)
    status = bytearray(n_arr)
    sess_host = [0] * n_arr
    sess_gpu = [0] * n_arr
    queue: deque[int] = deque()
    queued = 0
    waits: list[float] = []
    over = 0
    served = abandoned = rejected = force_ended = actions = 0
    running = 0
    peak_running = 0
    state = AutoscaleState()
    on_snaps: dict[int, HostSnapshot] = {}  # hosts not down, as the autoscaler sees them
    pool_now = pool if pool.strategy == strategy else replace(pool, strategy=strategy)

    def start_session(sid: int, t: float) -> bool:
        nonlocal running, peak_running, served, over
        spot = fleet.pick(strategy)
        if check_placement:
            expected = place(fleet.loads(), strategy)
            got = None if spot is None else (fleet.ids[spot[0]], spot[1])
            want = None if expected is None else (expected.host_id, expected.gpu_index)
            assert got == want, f"index chose {got}, place() chose {want}"
        if spot is None:
            return False
        i, g = spot
        fleet.seat(i, g, sid)
        sess_host[sid], sess_gpu[sid] = i, g
        status[sid] = _RUNNING
        running += 1
        peak_running = max(peak_running, running)
        served += 1
        wait = t - demand[sid].at_s
        waits.append(wait)
        if wait > WAIT_TARGET_S:
            over += 1
        push(t + demand[sid].duration_s, _END, sid)
        return True

    def serve_queue(t: float) -> None:
        nonlocal queued
        while queued:
            sid = queue[0]
            if status[sid] != _QUEUED:
                queue.popleft()
                continue
            if not start_session(sid, t):
                return
            queue.popleft()
            queued -= 1

    def end_session(sid: int, how: int) -> None:
        nonlocal running
        fleet.unseat(sess_host[sid], sess_gpu[sid], sid)
        status[sid] = how
        running -= 1

    def tick(t: float) -> None:
        nonlocal state, strategy, pool_now, actions, force_ended
        for i in fleet.dirty:
            st = fleet.state[i]
            if st == _DOWN:
                on_snaps.pop(i, None)
            else:
                on_snaps[i] = HostSnapshot(fleet.ids[i], st, fleet.used[i], fleet.seats)
        fleet.dirty.clear()
        snapshot = PoolSnapshot(pool_now, tuple(on_snaps.values()), max_hosts=n, queued=queued,
                                new_host_seats=fleet.seats, interval_s=float(config.tick_s), forecast=forecast)
        assert plan is not None
        decisions, state = decide(snapshot, config.start + timedelta(seconds=t), plan, state)
        for d in decisions:
            actions += 1
            if isinstance(d, SetStrategy):
                strategy = d.strategy
                pool_now = replace(pool, strategy=strategy)
            elif isinstance(d, StartHosts):
                for _ in range(d.count):
                    while down_heap and fleet.state[down_heap[0]] != _DOWN:
                        heapq.heappop(down_heap)
                    if not down_heap:
                        break
                    i = heapq.heappop(down_heap)
                    power_on(i, t, HOST_STARTING)
                    push(t + config.boot_delay_s, _HOST_UP, i)
            elif isinstance(d, Drain):
                fleet.set_state(fleet.by_id[d.host_id], _DRAINING)
            elif isinstance(d, Undrain):
                fleet.set_state(fleet.by_id[d.host_id], _UP)
            elif isinstance(d, StopHost):
                i = fleet.by_id[d.host_id]
                assert fleet.state[i] == _DRAINING and fleet.used[i] == 0, "StopHost on a busy host"
                stop_host(i, t)
            elif isinstance(d, EndSessions):
                i = fleet.by_id[d.host_id]
                for sid in sorted(fleet.sessions[i]):
                    end_session(sid, _FORCE_ENDED)
                    force_ended += 1
            elif isinstance(d, WarnSessions):
                pass  # users are told; nothing changes until EndSessions
        serve_queue(t)

    def stop_host(i: int, t: float) -> None:
        nonlocal host_seconds, hosts_on
        since = on_since[i]
        assert since is not None
        host_seconds += t - since
        on_since[i] = None
        hosts_on -= 1
        fleet.set_state(i, _DOWN)
        heapq.heappush(down_heap, i)

    next_arrival = 0
    limit = abort_over_60s
    t = 0.0
    while True:
        if next_arrival < n_arr and (not events or (demand[next_arrival].at_s, _ARRIVAL) < events[0][:2]):
            sid = next_arrival
            next_arrival += 1
            t = demand[sid].at_s
            if t >= horizon:
                break
            if queued == 0 and start_session(sid, t):
                pass
            elif queued >= pool.max_queue:
                status[sid] = _REJECTED
                rejected += 1
            else:
                status[sid] = _QUEUED
                queue.append(sid)
                queued += 1
                push(t + queue_timeout, _ABANDON, sid)
        elif events:
            t, kind, _, arg = heapq.heappop(events)
            if t >= horizon:
                break
            if kind == _END:
                if status[arg] == _RUNNING:
                    end_session(arg, _DONE)
                    serve_queue(t)
            elif kind == _HOST_UP:
                if fleet.state[arg] == HOST_STARTING:
                    fleet.set_state(arg, _UP)
                    serve_queue(t)
            elif kind == _TICK:
                tick(t)
                if t + config.tick_s < horizon:
                    push(t + config.tick_s, _TICK, 0)
            elif status[arg] == _QUEUED:  # _ABANDON of a request still waiting
                status[arg] = _ABANDONED
                queued -= 1
                abandoned += 1
                waits.append(queue_timeout)
        else:
            break
        if limit is not None and over + abandoned + rejected > limit:
            return _result(label, config, host_seconds + _open_seconds(on_since, t), n_arr, served, abandoned,
                           rejected, peak_running, peak_hosts_on, waits, over, force_ended, actions, aborted=True)
    return _result(label, config, host_seconds + _open_seconds(on_since, horizon), n_arr, served, abandoned,
                   rejected, peak_running, peak_hosts_on, waits, over, force_ended, actions, aborted=False)


def _open_seconds(on_since: Sequence[float | None], t: float) -> float:
    return sum(t - s for s in on_since if s is not None)


def _result(label: str, config: SimConfig, host_seconds: float, arrivals: int, served: int, abandoned: int,
            rejected: int, peak_running: int, peak_hosts_on: int, waits: list[float], over: int, force_ended: int,
            actions: int, *, aborted: bool) -> SimResult:
    waits.sort()
    failures = over + abandoned + rejected
    hours = host_seconds / 3600.0
    return SimResult(
        label=label, host_hours=round(hours, 3), cost=round(hours * config.price_per_host_hour, 2),
        arrivals=arrivals, served=served, abandoned=abandoned, rejected=rejected,
        peak_concurrency=peak_running, peak_hosts_on=peak_hosts_on,
        wait_p50_s=percentile(waits, 50), wait_p95_s=percentile(waits, 95), wait_p99_s=percentile(waits, 99),
        waited_over_60s_pct=round(100.0 * failures / arrivals, 4) if arrivals else 0.0,
        force_ended=force_ended, actions=actions, aborted=aborted,
    )


# --- comparison and recommendation ------------------------------------------------------------


def compare(demand: Sequence[Arrival], config: SimConfig, plans: Sequence[tuple[str, ScalingPlan | None]], *,
            forecast: DemandForecast | None = None) -> list[SimResult]:
    """Simulate each (label, plan) on the same demand; plan None is always-on; predictive plans use ``forecast``."""
    return [simulate(demand, config, plan, label=label, forecast=forecast) for label, plan in plans]


@dataclass(frozen=True)
class PlanParams:
    """The knobs `recommend` turns (the same values for every schedule of the plan)."""

    up_threshold_pct: float  # ramp-up and peak capacity threshold
    down_threshold_pct: float  # ramp-down and off-peak capacity threshold
    up_min_hosts_pct: float  # ramp-up and peak minimum hosts
    down_min_hosts_pct: float  # ramp-down and off-peak minimum hosts

    def label(self) -> str:
        return (f"thr {self.up_threshold_pct:g}/{self.down_threshold_pct:g}% "
                f"min {self.up_min_hosts_pct:g}/{self.down_min_hosts_pct:g}%")


# Joint aggressiveness levels for the coarse pass, most conservative (most hosts) first.
COARSE_LEVELS: Final = (
    PlanParams(50, 70, 30, 10),
    PlanParams(60, 80, 20, 5),
    PlanParams(70, 85, 10, 2),
    PlanParams(80, 90, 5, 0),
    PlanParams(90, 95, 0, 0),
)


def apply_params(plan: ScalingPlan, params: PlanParams) -> ScalingPlan:
    """``plan`` with every schedule's thresholds and minimums set from ``params``."""
    def tuned(ps: PhaseSettings, up: bool) -> PhaseSettings:
        return replace(ps, capacity_threshold_pct=params.up_threshold_pct if up else params.down_threshold_pct,
                       min_hosts_pct=params.up_min_hosts_pct if up else params.down_min_hosts_pct)

    schedules = tuple(replace(s, ramp_up=tuned(s.ramp_up, True), peak=tuned(s.peak, True),
                              ramp_down=tuned(s.ramp_down, False), off_peak=tuned(s.off_peak, False))
                      for s in plan.schedules)
    return replace(plan, name=f"{plan.name}-tuned", schedules=schedules)


@dataclass(frozen=True)
class Recommendation:
    plan: ScalingPlan
    params: PlanParams
    result: SimResult
    meets_target: bool  # False: no candidate met the target; the most conservative one is returned
    target_over_60s_pct: float
    evaluated: tuple[tuple[PlanParams, SimResult], ...]  # every candidate simulated, in order


def recommend(demand: Sequence[Arrival], config: SimConfig, base: ScalingPlan = DEFAULT_PLAN, *,
              target_over_60s_pct: float = 1.0, refine_rounds: int = 2) -> Recommendation:
    """The cheapest plan (by host-hours) found with <= ``target_over_60s_pct`` % of requests waiting over 60 s.

    Coarse: binary search over `COARSE_LEVELS` (joint settings, assumed monotone: a more
    aggressive level costs less and waits more) for the most aggressive level that meets the
    target.  Refine: ``refine_rounds`` passes of coordinate search that move one parameter at a
    time halfway toward the next (failing) level, keeping a move when the plan still meets the
    target and costs less.  Candidates that miss the target abort early, so a search of about a
    dozen candidates costs a few full simulations.
    """
    limit = math.floor(target_over_60s_pct / 100.0 * len(demand))
    evaluated: list[tuple[PlanParams, SimResult]] = []
    cache: dict[PlanParams, SimResult] = {}

    def run(params: PlanParams) -> SimResult:
        if params not in cache:
            result = simulate(demand, config, apply_params(base, params), label=params.label(),
                              abort_over_60s=limit)
            cache[params] = result
            evaluated.append((params, result))
        return cache[params]

    def ok(r: SimResult) -> bool:
        return not r.aborted and r.waited_over_60s_pct <= target_over_60s_pct

    lo, hi = -1, len(COARSE_LEVELS)  # invariant: level lo meets the target (-1: none known), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(run(COARSE_LEVELS[mid])):
            lo = mid
        else:
            hi = mid
    if lo < 0:
        params = COARSE_LEVELS[0]
        return Recommendation(apply_params(base, params), params, run(params), False, target_over_60s_pct,
                              tuple(evaluated))
    best = COARSE_LEVELS[lo]
    best_result = run(best)
    toward = COARSE_LEVELS[hi] if hi < len(COARSE_LEVELS) else PlanParams(100, 100, 0, 0)
    inert: set[str] = set()  # parameters whose move changed nothing (e.g. a minimum demand always exceeds)
    for _ in range(refine_rounds):
        moved = False
        for name in ("up_threshold_pct", "up_min_hosts_pct", "down_threshold_pct", "down_min_hosts_pct"):
            here, there = getattr(best, name), getattr(toward, name)
            step = (there - here) / 2
            if abs(step) < 1.0 or name in inert:
                continue
            candidate = replace(best, **{name: round(here + step, 1)})
            result = run(candidate)
            if ok(result) and result.host_hours < best_result.host_hours:
                best, best_result, moved = candidate, result, True
            elif replace(result, label="") == replace(best_result, label=""):
                inert.add(name)
        if not moved:
            # halve the distance to the failing side: the next round probes closer to the current best
            toward = PlanParams(*((b + (t - b) / 2) for b, t in zip(
                (best.up_threshold_pct, best.down_threshold_pct, best.up_min_hosts_pct, best.down_min_hosts_pct),
                (toward.up_threshold_pct, toward.down_threshold_pct, toward.up_min_hosts_pct,
                 toward.down_min_hosts_pct), strict=True)))
    return Recommendation(apply_params(base, best), best, best_result, True, target_over_60s_pct, tuple(evaluated))


# --- CLI ------------------------------------------------------------------------------------

TABLE_COLUMNS: Final = (("plan", 44), ("host-h", 10), ("cost", 11), ("vs always-on", 12), ("p50 s", 7),
                        ("p95 s", 7), ("p99 s", 7), (">60s %", 7), ("forced", 7), ("peak conc", 9),
                        ("peak hosts", 10))


def format_table(results: Sequence[SimResult], baseline_host_hours: float | None = None, *,
                 oracle_host_hours: float | None = None, bound_host_hours: float | None = None) -> str:
    """A fixed-width comparison table; savings are relative to ``baseline_host_hours`` (or the first row).

    With ``oracle_host_hours`` / ``bound_host_hours`` (`broker.autoscale.oracle`) each row also shows
    its host-hours as a multiple of the packing oracle's and of the lower bound's.
    """
    base = baseline_host_hours if baseline_host_hours is not None else (results[0].host_hours if results else 0.0)
    extra = [(name, 8, ref) for name, ref in (("x oracle", oracle_host_hours), ("x bound", bound_host_hours))
             if ref is not None]
    columns = (*TABLE_COLUMNS, *((name, w) for name, w, _ in extra))
    lines = ["  ".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w) in enumerate(columns))]
    for r in results:
        change = f"{100.0 * (r.host_hours / base - 1):+.1f}%" if base else "-"
        cells = (r.label[:44], f"{r.host_hours:,.0f}", f"{r.cost:,.2f}", change, f"{r.wait_p50_s:.0f}",
                 f"{r.wait_p95_s:.0f}", f"{r.wait_p99_s:.0f}", f"{r.waited_over_60s_pct:.2f}", str(r.force_ended),
                 str(r.peak_concurrency), str(r.peak_hosts_on),
                 *(f"{r.host_hours / ref:.3f}" if ref else "-" for _, _, ref in extra))
        lines.append("  ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, (_, w)) in
                               enumerate(zip(cells, columns, strict=True))))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``render-broker simulate``: compare always-on, the default plan and a recommended plan."""
    parser = argparse.ArgumentParser(prog="render-broker simulate", description=(
        "Simulate a pool under synthetic weekly demand and compare always-on capacity, the default "
        "scaling plan and the cheapest plan found that meets the wait target."))
    parser.add_argument("--hosts", type=int, default=100, help="hosts the provider may run (pool maximum)")
    parser.add_argument("--seats-per-host", type=int, default=4)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--peak-concurrency", type=int, default=350, help="sessions at the weekday peak")
    parser.add_argument("--price", type=float, default=1.0, help="price per host-hour")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mean-duration-min", type=float, default=60.0)
    parser.add_argument("--boot-delay-s", type=int, default=300)
    parser.add_argument("--tick-s", type=int, default=300, help="autoscaler evaluation period")
    parser.add_argument("--queue-timeout-s", type=int, default=600)
    parser.add_argument("--target-wait-pct", type=float, default=1.0,
                        help="recommend: at most this %% of requests may wait over 60 s")
    parser.add_argument("--no-recommend", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.hosts < 1 or args.seats_per_host < 1 or args.days <= 0 or args.peak_concurrency < 0:
        parser.error("--hosts, --seats-per-host, --days must be positive and --peak-concurrency >= 0")

    pool = PoolConfig("simulated", max_sessions_per_gpu=args.seats_per_host, max_queue=1_000_000,
                      queue_timeout_s=args.queue_timeout_s)
    config = SimConfig(pool, hosts=args.hosts, seats_per_host=args.seats_per_host, days=args.days,
                       tick_s=args.tick_s, boot_delay_s=args.boot_delay_s, price_per_host_hour=args.price)
    demand = synthetic_demand(args.peak_concurrency, args.days, seed=args.seed,
                              mean_duration_s=args.mean_duration_min * 60, start_weekday=config.start.weekday())
    results = compare(demand, config, [("always-on", None), ("default plan", DEFAULT_PLAN)])
    rec = None
    if not args.no_recommend:
        rec = recommend(demand, config, target_over_60s_pct=args.target_wait_pct)
        final = rec.result if not rec.result.aborted else simulate(demand, config, rec.plan)
        results.append(replace(final, label=f"recommended ({rec.params.label()})"))
    if args.json:
        out: dict[str, Any] = {"arrivals": len(demand), "results": [r.to_dict() for r in results]}
        if rec is not None:
            out["recommended_plan"] = rec.plan.to_dict()
            out["meets_target"] = rec.meets_target
            out["candidates_evaluated"] = len(rec.evaluated)
        print(json.dumps(out, indent=2))
        return 0
    horizon = args.days * DAY_S
    oracle = packing_oracle(demand, args.seats_per_host, args.boot_delay_s, horizon).host_hours
    bound = lower_bound(demand, args.seats_per_host, args.boot_delay_s, horizon)
    print(f"{len(demand):,} session requests over {args.days:g} days; {args.hosts} hosts x {args.seats_per_host} "
          f"seats; price {args.price:g}/host-hour; packing oracle {oracle:,.0f} host-hours, lower bound "
          f"{bound:,.0f}")
    print(format_table(results, oracle_host_hours=oracle, bound_host_hours=bound))
    if rec is not None and not rec.meets_target:
        print(f"note: no candidate met the target of <= {args.target_wait_pct:g}% waiting over 60 s")
    return 0
