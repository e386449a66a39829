"""Seat counting and host placement: the pure policy behind seating.

The authoritative seating step runs inside Redis (``store/lua/create_session.lua`` with ``prelude.lua``)
so replicas cannot over-seat; this module is the same policy written in Python
for the autoscaler, the simulator and the dashboard's capacity figures, and a
table test checks both agree on the same inputs.

Rules (AVD host-pool semantics):
- A GPU's seat count is min(max_sessions_per_gpu, encoder session limit,
  floor(vram_mb * (1 - vram_headroom) / vram_per_session_mb)).
- Only hosts that are ``up`` (not draining, not down) receive sessions.
- breadth-first: the host with the fewest sessions that has a free seat
  (ties: most free seats, then host id); depth-first: the host with the most
  sessions still under its limit (ties: host id).
- Within a host, the GPU with the fewest used seats (ties: lowest index).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.protocol import HostState, PlacementStrategy


def gpu_seats(vram_mb: int, encoder_session_limit: int | None, max_sessions_per_gpu: int,
              vram_per_session_mb: int, vram_headroom: float) -> int:
    """Seats one GPU offers under a pool's rules (never negative)."""
    by_vram = math.floor(vram_mb * (1.0 - vram_headroom) / vram_per_session_mb + 1e-9)
    limits = [max_sessions_per_gpu, by_vram]
    if encoder_session_limit is not None:
        limits.append(encoder_session_limit)
    return max(0, min(limits))


@dataclass(frozen=True)
class GpuLoad:
    index: int
    seats: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.seats - self.used)


@dataclass(frozen=True)
class HostLoad:
    host_id: str
    state: str
    gpus: tuple[GpuLoad, ...]

    @property
    def seats(self) -> int:
        return sum(g.seats for g in self.gpus)

    @property
    def used(self) -> int:
        return sum(g.used for g in self.gpus)

    @property
    def free(self) -> int:
        return sum(g.free for g in self.gpus)


@dataclass(frozen=True)
class Placement:
    host_id: str
    gpu_index: int
    reason: str


def place(hosts: Iterable[HostLoad], strategy: str) -> Placement | None:
    """Choose a host and GPU for one new session, or None when no seat is free."""
    candidates = [h for h in hosts if h.state == HostState.UP and h.free > 0]
    if not candidates:
        return None
    if strategy == PlacementStrategy.DEPTH_FIRST:
        host = min(candidates, key=lambda h: (-h.used, h.host_id))
        why = f"depth-first: fullest host under its limit ({host.used}/{host.seats})"
    else:
        host = min(candidates, key=lambda h: (h.used, -h.free, h.host_id))
        why = f"breadth-first: least-loaded host ({host.used}/{host.seats})"
    gpu = min((g for g in host.gpus if g.free > 0), key=lambda g: (g.used, g.index))
    return Placement(host.host_id, gpu.index, why)


def with_session(hosts: Sequence[HostLoad], placement: Placement, delta: int = 1) -> list[HostLoad]:
    """Hosts after adding (delta=1) or removing (delta=-1) one session at ``placement``."""
    out = []
    for h in hosts:
        if h.host_id != placement.host_id:
            out.append(h)
            continue
        gpus = tuple(GpuLoad(g.index, g.seats, g.used + delta) if g.index == placement.gpu_index else g
                     for g in h.gpus)
        out.append(HostLoad(h.host_id, h.state, gpus))
    return out
