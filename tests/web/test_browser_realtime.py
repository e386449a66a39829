"""Chromium plays sound with none of its threads on real-time scheduling.

Run as root, Chromium moves its audio threads (the renderer's AudioOutputDevice, the audio service's
AudioWorkerThread) to SCHED_RR 8; nothing the test run starts may take real-time priority
(tests/conftest.py, rbcommon.realtime), so it cannot.  Every thread of the browser's processes is
checked while a page plays a tone, from the moment its audio threads exist.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from encoder.sched import REALTIME_POLICIES
from tests import leakguard

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

AUDIO_THREADS = ("AudioOutputDevi", "AudioWorkerThre")  # /proc comm keeps 15 characters
TONE_PAGE = """<script>
const ctx = new AudioContext();
const osc = ctx.createOscillator();
osc.connect(ctx.destination);
osc.start();
window.audioState = () => ctx.state;
</script>"""


def chromium_pids() -> list[int]:
    return [p.pid for p in leakguard.ours().values() if p.comm.startswith("chrom")]


def realtime_threads(pid: int) -> list[tuple[int, int]]:
    """(tid, policy) of each thread of process ``pid`` on a real-time policy."""
    found = []
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
    for tid in tids:
        try:
            policy = os.sched_getscheduler(tid)
        except OSError:  # ended meanwhile
            continue
        if policy in REALTIME_POLICIES:
            found.append((tid, policy))
    return found


def thread_names(pid: int) -> list[str]:
    names = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names


async def test_chromium_plays_a_tone_with_no_realtime_thread(browser: Any) -> None:
    page = await browser.new_page()
    await page.set_content(TONE_PAGE)
    await page.wait_for_function("window.audioState && window.audioState() === 'running'")
    audio_seen: set[str] = set()
    for _ in range(30):  # 3 s from the first audio thread: Chromium sets the policy as each thread starts
        pids = chromium_pids()
        assert pids, "no Chromium process found in this test run's process tree"
        found = {pid: rt for pid in pids if (rt := realtime_threads(pid))}
        assert not found, f"Chromium threads on a real-time policy, by pid (tid, policy): {found}"
        audio_seen.update(name for pid in pids for name in thread_names(pid) if name in AUDIO_THREADS)
        await asyncio.sleep(0.1)
    assert audio_seen, "Chromium started no audio thread: the check above saw nothing it was meant to catch"
