"""What a scaler that knew the future could do: the packing oracle and the strict lower bound.

Job: give the autoscaler benchmark and the sizing report a yardstick that is not "always-on".
Both figures are computed on the same demand the simulator replays (`Arrival`: when a request
comes and how long its session runs), on identical hosts of ``seats_per_host`` seats, over
``[0, horizon_s)``, with a host billed from its start request (boot included) until it stops:

  - `packing_oracle`: zero wait.  Every session starts the moment it is requested, on the up
    host with the most used seats that still has a free one (depth-first, lowest index on a
    tie -- the simulator's depth-first rule); when none has one, the lowest-index stopped host
    is started exactly ``boot_s`` before the request (never before t = 0), and a host stops
    the moment its last session ends.  A host that would be restarted before it stopped is
    simply kept on (billed once).  It knows arrivals but not how to migrate sessions, so its
    host-hours include the fragmentation any non-migrating placement pays.
  - `lower_bound`: no placement at all.  A host serving at any instant of ``[t, t + boot_s]``
    is billed at ``t`` (it cannot have been started later), so at every instant at least
    ``max over [t, t + boot_s] of ceil(concurrent / seats)`` hosts are billed.  Its integral
    over the horizon is a bound no scaler, with or without foresight or migration, can beat.

Concurrency model: none.  Pure functions of their arguments, no clock, no I/O.

Invariants: at equal times a session end is processed before an arrival (as in the simulator);
arrivals at or after ``horizon_s`` are ignored; billing stops at ``horizon_s``;
``lower_bound(...) <= packing_oracle(...).host_hours``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Session(Protocol):
    """A session request: when it comes (seconds after the start) and how long it runs."""

    @property
    def at_s(self) -> float: ...

    @property
    def duration_s(self) -> float: ...


@dataclass(frozen=True)
class OracleResult:
    host_hours: float
    starts: int  # host starts (each billed its boot time)
    peak_hosts_on: int


def packing_oracle(demand: Sequence[Session], seats_per_host: int, boot_s: float, horizon_s: float) -> OracleResult:
    """Host-hours of the zero-wait depth-first packing oracle (see the module docstring)."""
    if seats_per_host < 1:
        raise ValueError("seats_per_host must be >= 1")
    seats = seats_per_host
    used: list[int] = []
    on_since: list[float | None] = []
    stopped_at: list[float] = []
    buckets: list[list[int]] = [[] for _ in range(seats)]  # buckets[u]: lazy min-heap of up hosts with u used
    stopped: list[int] = []  # min-heap of stopped host indices
    ends: list[tuple[float, int]] = []
    billed = 0.0
    starts = on = peak = 0

    def end_one(te: float, h: int) -> None:
        nonlocal billed, on
        used[h] -= 1
        if used[h] == 0:
            since = on_since[h]
            assert since is not None
            billed += min(te, horizon_s) - since
            on_since[h] = None
            stopped_at[h] = te
            on -= 1
            heapq.heappush(stopped, h)
        else:
            heapq.heappush(buckets[used[h]], h)

    for a in sorted(demand, key=lambda s: s.at_s):
        t = a.at_s
        if t >= horizon_s:
            break
        while ends and ends[0][0] <= t:
            end_one(*heapq.heappop(ends))
        host = -1
        for u in range(seats - 1, 0, -1):
            b = buckets[u]
            while b and (on_since[b[0]] is None or used[b[0]] != u):
                heapq.heappop(b)
            if b:
                host = heapq.heappop(b)
                break
        if host < 0:
            if stopped:
                host = heapq.heappop(stopped)
            else:
                host = len(used)
                used.append(0)
                on_since.append(None)
                stopped_at.append(-math.inf)
            since = max(0.0, t - boot_s)
            if since < stopped_at[host]:  # it would restart before it stopped: it is kept on instead
                since = stopped_at[host]
            else:
                starts += 1
            on_since[host] = since
            on += 1
            peak = max(peak, on)
        used[host] += 1
        if used[host] < seats:
            heapq.heappush(buckets[used[host]], host)
        heapq.heappush(ends, (t + a.duration_s, host))
    while ends:
        end_one(*heapq.heappop(ends))
    return OracleResult(billed / 3600.0, starts, peak)


def hosts_needed_steps(demand: Sequence[Session], seats_per_host: int, horizon_s: float) -> list[tuple[float, int]]:
    """ceil(concurrent sessions / seats) as a step function: (from time, hosts) pairs, first at t = 0."""
    events: list[tuple[float, int]] = []
    for a in demand:
        if a.at_s < horizon_s:
            events.append((a.at_s, 1))
            events.append((a.at_s + a.duration_s, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # ends (-1) before arrivals (+1) at equal times
    steps: list[tuple[float, int]] = [(0.0, 0)]
    c = 0
    for i, (t, k) in enumerate(events):
        c += k
        if i + 1 < len(events) and events[i + 1][0] == t:
            continue  # the level between two equal times lasts no time
        v = -(-c // seats_per_host)
        if v != steps[-1][1]:
            if steps[-1][0] == t:
                steps[-1] = (t, v)
            else:
                steps.append((t, v))
    return steps


def lower_bound(demand: Sequence[Session], seats_per_host: int, boot_s: float, horizon_s: float) -> float:
    """Host-hours no scaler can beat: the integral of max over [t, t + boot_s] of ceil(concurrent / seats)."""
    if seats_per_host < 1:
        raise ValueError("seats_per_host must be >= 1")
    steps = hosts_needed_steps(demand, seats_per_host, horizon_s)
    starts = [s for s, _ in steps]
    values = [v for _, v in steps]
    n = len(steps)
    # segment i covers [starts[i], starts[i+1]) (the last one never ends); the window [t, t + boot]
    # holds segment i while starts[i] <= t + boot and its end > t.  g(t) changes only at start - boot
    # or at an end, so it is constant between consecutive such points.
    points = sorted({0.0, horizon_s, *(min(horizon_s, max(0.0, s - boot_s)) for s in starts),
                     *(min(horizon_s, s) for s in starts[1:])})
    window: deque[int] = deque()  # segment indices in the window, values decreasing
    hi = lo = 0
    area = 0.0
    for p, q in itertools.pairwise(points):
        m = (p + q) / 2
        while hi < n and starts[hi] <= m + boot_s:
            while window and values[window[-1]] <= values[hi]:
                window.pop()
            window.append(hi)
            hi += 1
        while lo + 1 < n and starts[lo + 1] <= m:  # segment lo ended before m
            lo += 1
        while window and window[0] < lo:
            window.popleft()
        area += (values[window[0]] if window else 0) * (q - p)
    return area / 3600.0
