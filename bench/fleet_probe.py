"""Read what ``bench/probe_site/sitecustomize.py`` recorded in a broker and say what seatings waited behind.

``bench_fleet.py --probe`` loads the probe into its brokers; after each run this summarizes one
broker's records over the seating window: the seatings' latency at the client against the
handler's own time and its Lua round trip (the rest is the wait for the event loop to read the
request and write the reply, and the generator's own lag), the loop's stalls over 8 ms split by
whether the loop thread ran through them (its own work) or waited for a core, garbage collections
by generation with their wall and CPU times, the stacks sampled during the loop's own stalls, and
the slowest seatings with the stalls and collections they overlapped.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any


def _pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _dist(values: Sequence[float]) -> str:
    return f"n {len(values)}, p50/p99/max {_pct(values, .5):.1f}/{_pct(values, .99):.1f}/{max(values or [0]):.1f} ms"


def summarize(rec: dict[str, Any], seat_at: Sequence[float], seat_ms: Sequence[float], top: int = 5) -> list[str]:
    """Lines describing the seating window (the first seating's start to the last one's reply)."""
    if not seat_at:
        return ["probe: no seatings"]
    w0, w1 = min(seat_at), max(a + m / 1000 for a, m in zip(seat_at, seat_ms, strict=True))

    def inside(t: float) -> bool:
        return w0 <= t <= w1

    out = [f"probe, seating window {w1 - w0:.1f} s: seat at the client {_dist(seat_ms)}"]
    for kind, name in (("seat", "create_session"), ("hb", "heartbeat"), ("end", "end_session")):
        handler = [r[2] for r in rec["req"] if r[0] == kind and inside(r[1])]
        lua = [r[2] for r in rec["lua"] if r[0] == name and inside(r[1])]
        out.append(f"  {kind}: in the handler {_dist(handler)}; its Lua round trip {_dist(lua)}")
    stalls = [s for s in rec["stall"] if inside(s[0])]
    own = [s for s in stalls if s[2] > 0.6 * s[1]]
    wall = sum(s[1] for s in stalls)
    out.append(f"  loop stalls over 8 ms: {len(stalls)}, {wall:.0f} ms ({100 * wall / 1000 / (w1 - w0):.0f} % of the "
               f"window), the loop thread's CPU in them {sum(s[2] for s in stalls):.0f} ms; its own work (CPU over "
               f"60 % of the stall): {len(own)}, {sum(s[1] for s in own):.0f} ms, "
               f"longest {max([s[1] for s in own] or [0]):.0f} ms")
    gcs = [g for g in rec["gc"] if inside(g[0])]
    for gen in (0, 1, 2):
        g = [x for x in gcs if x[3] == gen]
        if g:
            out.append(f"  gc generation {gen}: {len(g)} collections, wall p50/max {_pct([x[1] for x in g], .5):.1f}/"
                       f"{max(x[1] for x in g):.1f} ms, CPU p50/max {_pct([x[2] for x in g], .5):.1f}/"
                       f"{max(x[2] for x in g):.1f} ms, CPU total {sum(x[2] for x in g):.0f} ms")
    stacks: collections.Counter[str] = collections.Counter()
    for s in own:
        for st, n in s[3]:
            stacks[" < ".join(st.split(" < ")[:4])] += n
    if stacks:
        out.append("  stacks sampled in the loop's own stalls (innermost 4 frames):")
        out += [f"    {n:4d}  {st}" for st, n in stacks.most_common(8)]
    out.append(f"  slowest {top} seatings (ms at the client: handler / Lua; overlapping stalls as start+ms:wall/cpu; "
               "collections as gen:ms):")
    for i in sorted(range(len(seat_ms)), key=lambda i: -seat_ms[i])[:top]:
        t0, t1 = seat_at[i], seat_at[i] + seat_ms[i] / 1000
        handler = [round(r[2]) for r in rec["req"] if r[0] == "seat" and t0 <= r[1] <= t1]
        lua = [round(r[2]) for r in rec["lua"] if r[0] == "create_session" and t0 <= r[1] <= t1]
        over = [f"{(s[0] - t0) * 1000:+.0f}:{s[1]:.0f}/{s[2]:.0f}" for s in rec["stall"]
                if s[0] < t1 and s[0] + s[1] / 1000 > t0]
        coll = [f"{g[3]}:{g[1]:.0f}" for g in rec["gc"] if g[0] < t1 and g[0] + g[1] / 1000 > t0 and g[1] > 2]
        out.append(f"    {seat_ms[i]:.0f}: handler {handler} / Lua {lua}; stalls {over}; gc {coll}")
    if rec.get("errors"):
        out.append(f"  probe errors: {len(rec['errors'])}, first {rec['errors'][0]}")
    return out
