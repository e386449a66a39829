"""Smoke test of bench/bench_fleet.py: a tiny fleet for a few seconds against one real broker process.

It checks that the benchmark measures real things (heartbeats and seatings answered, broker CPU,
Redis commands per operation from a private redis-server) and that a run leaves no process
behind; it asserts no timings beyond "more than zero".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import bench_fleet as bench

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]


def _children() -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    out.add(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


@pytest.mark.parametrize(("gen_procs", "probe"), [(1, False), (2, True)])
async def test_a_tiny_fleet_is_measured_and_cleaned_up(gen_procs: int, probe: bool) -> None:
    """With ``gen_procs`` 2 the hosts and SSE readers live in two worker processes driven over pipes,
    and the broker carries the probe (bench/probe_site), whose records the run summarizes."""
    before = _children()
    cfg = bench.FleetConfig(hosts=3, replicas=1, sessions_per_host=2, heartbeat_s=1.0, steady_s=1.5, seatings=4,
                            seat_rate=4.0, seat_hold_s=0.5, start_delay_s=(0.01, 0.05), quiet_s=0.5, isolated=3,
                            run_timeout_s=90, gen_procs=gen_procs)
    lines: list[str] = []
    res = await bench.run_fleet(cfg, db="sqlite", log=lines.append, probe=probe)
    assert res.note == "", res.note
    assert lines and "3 hosts, 6 sessions (6 running), 2 event streams" in lines[0]
    assert f"{gen_procs} generator process(es)" in lines[0]
    # every host heartbeats about once a second through the 3.5 s recorded window, whichever process runs it
    assert len(res.stats.hb_ms) >= 6 and len(res.stats.hb_ms) == len(res.stats.hb_at) == res.stats.heartbeats
    assert len(res.stats.seat_ms) == 4 and res.seat_errors == 0
    assert sum(res.ended_wrongly.values()) == 0 and res.hosts_lost == 0, (res.ended_wrongly, res.stats.errors)
    assert res.stats.stops_unasked == 0, res.stats.errors  # the workers were told which ends were ours
    assert not res.stats.errors, res.stats.errors
    assert res.broker_cpu_pct[0] > 0 and res.cmds_per_hb > 0 and res.cmds_per_seat > 0 and res.cmds_per_end > 0
    assert res.scripts_per_hb == 1 and res.scripts_per_seat == 1  # one Lua step each
    # CPU and loop lag of the main process and of each worker (a worker's CPU is its hosts' work: above zero)
    assert len(res.gen_cpu_pct) == len(res.gen_lag_p99) == 1 + (gen_procs if gen_procs > 1 else 0)
    assert all(c > 0 for c in res.gen_cpu_pct[1:]), res.gen_cpu_pct
    if probe:  # the broker timed the 4 measured seatings in its handler and their Lua steps
        assert any("seat: in the handler n 4," in line and "Lua round trip n 4," in line for line in res.probe), \
            res.probe
        assert not any("probe errors" in line for line in res.probe), res.probe
    else:
        assert res.probe == []
    row = bench.row(res)
    assert len(row) == len(bench.HEADER) and row[1] == "3"
    assert _children() <= before  # brokers, redis-server and generator workers are gone
