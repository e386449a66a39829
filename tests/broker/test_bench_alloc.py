"""Smoke test of ``render-broker bench`` (broker/bench.py): both servers, a second each.

It checks that the benchmark measures real things (seat steps answered 201 by a real broker process,
the bare server's POST/DELETE pair, each server's CPU per iteration read from /proc) and that a run
leaves no process and no Redis key behind; it asserts no timings beyond "more than zero".
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import redis

from broker import bench

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


async def test_both_servers_measure_real_work(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _children()
    r = redis.Redis.from_url(redis_url)
    left_before_cleanup: list[int] = []
    delete_keys = bench._delete_keys

    async def counting_delete(url: str, pattern: str) -> int:
        left_before_cleanup.append(len(list(r.scan_iter(pattern, count=1000))))
        return await delete_keys(url, pattern)

    monkeypatch.setattr(bench, "_delete_keys", counting_delete)
    broker = await bench.bench_broker(redis_url, 2, 1.0, prefix=prefix)
    bare = await bench.bench_bare(redis_url, 2, 1.0, key=f"{prefix}:bare")
    for run in (broker, bare):
        assert run.per_s > 0 and len(run.lat) > 0 and min(run.lat) > 0
        assert math.isfinite(run.cpu_ms) and run.cpu_ms > 0  # the server process really worked
    assert _children() <= before  # both servers are gone
    assert len(left_before_cleanup) == 2 and left_before_cleanup[0] > 0  # the broker wrote under its prefix ...
    assert list(r.scan_iter(f"{prefix}:*", count=1000)) == []  # ... and no key of either run is left
    r.close()


def test_cpu_of_a_missing_process_is_nan() -> None:
    assert math.isnan(bench._cpu_s(2**22 + 12345))
