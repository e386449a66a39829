"""Real measurements through a netem Lab: rate, queue, loss, delay, jitter, live change, cleanup.

Every test sends real UDP through real namespaces (``udpprobe.py`` run via ``Lab.popen``) and
compares what arrived against generous bounds derived from the configured conditions, so a
loaded 2-core machine slows the tests but does not flip them.  Skipped, with the reason, where
namespaces cannot be made (not root, tools or NetfilterQueue missing).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.netem.lab import (
    NFT_TABLE,
    NS_PREFIX,
    Lab,
    LabError,
    Link,
    Side,
    Step,
    sweep_stale_namespaces,
    unavailable_reason,
)

PROBE = str(Path(__file__).with_name("udpprobe.py"))
PORT = 5201
SIZE = 1200  # UDP payload bytes; IP packets are 1228 bytes
IP_SIZE = SIZE + 28

pytestmark = pytest.mark.timeout(120)


@dataclass
class Flow:
    """What one probe run delivered: seq/send/recv per received packet (ns, CLOCK_MONOTONIC)."""

    sent: int
    records: list[list[int]]

    @property
    def received(self) -> int:
        return len(self.records)

    def one_way_ms(self) -> list[float]:
        return sorted((r[2] - r[1]) / 1e6 for r in self.records)

    def rate_bps(self, start_ns: int, end_ns: int) -> float:
        """Delivered IP bit/s over the window [start_ns, end_ns) of receive times."""
        n = sum(1 for r in self.records if start_ns <= r[2] < end_ns)
        return n * IP_SIZE * 8 / ((end_ns - start_ns) / 1e9)

    def reordered(self) -> int:
        seqs = [r[0] for r in self.records]
        return sum(1 for a, b in itertools.pairwise(seqs) if b < a)


def pct(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(int(p / 100 * len(sorted_values)), len(sorted_values) - 1)]


def run_flow(lab: Lab, direction: str, rate_bps: int, count: int, idle_s: float = 0.6) -> Flow:
    """Send ``count`` datagrams node -> viewer ("down") or viewer -> node ("up") at ``rate_bps``."""
    src: Side = "node" if direction == "down" else "viewer"
    dst: Side = "viewer" if direction == "down" else "node"
    dst_ip = lab.viewer_ip if direction == "down" else lab.node_ip
    receiver = lab.popen(
        dst, [sys.executable, PROBE, "recv", f"--port={PORT}", f"--idle={idle_s}"], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "READY"
    sender = lab.popen(
        src,
        [
            sys.executable,
            PROBE,
            "send",
            f"--dst={dst_ip}",
            f"--port={PORT}",
            f"--rate-bps={rate_bps}",
            f"--size={SIZE}",
            f"--count={count}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    sent_out, _ = sender.communicate(timeout=60)
    recv_out, _ = receiver.communicate(timeout=60)
    assert sender.returncode == 0 and receiver.returncode == 0
    sent = json.loads(sent_out)["sent"]
    return Flow(sent=sent, records=json.loads(recv_out)["records"])


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"netem lab unavailable: {reason}")
    with Lab() as lab:
        yield lab


@pytest.fixture
def fresh(lab: Lab) -> Lab:
    """The shared lab with both directions reset to an unconstrained path."""
    lab.set_downlink(Link())
    lab.set_uplink(Link())
    return lab


def test_link_validation() -> None:
    with pytest.raises(ValueError):
        Link(loss_percent=101)
    with pytest.raises(ValueError):
        Link(rate_bps=0)
    with pytest.raises(ValueError):
        Link(delay_ms=-1)
    assert Link(rate_bps=4_000_000, queue_ms=100).queue_limit_bytes() == 50_000
    assert Link(rate_bps=100_000, queue_ms=10).queue_limit_bytes() == 3_000  # two packets at least
    assert Link(loss_percent=0.25).loss_threshold() == 25


def test_clean_path_delivers_everything_quickly(fresh: Lab) -> None:
    flow = run_flow(fresh, "down", rate_bps=5_000_000, count=500)
    assert flow.received == 500
    assert flow.reordered() == 0
    assert pct(flow.one_way_ms(), 50) < 20.0  # the emulator at 0 ms adds well under this
    c = fresh.counters()["downlink"]
    assert c["ingress_packets"] >= 500 and c["loss_dropped_packets"] == 0 and c["queue_dropped_packets"] == 0


def test_rate_limit_caps_a_blast_and_drops_at_the_queue(fresh: Lab) -> None:
    fresh.set_downlink(Link(rate_bps=4_000_000, queue_ms=100))
    before = fresh.counters()["downlink"]
    flow = run_flow(fresh, "down", rate_bps=50_000_000, count=6000)  # ~1.2 s of 50 Mbit/s
    after = fresh.counters()["downlink"]
    first, last = flow.records[0][2], flow.records[-1][2]
    goodput_bps = (flow.received - 1) * IP_SIZE * 8 / ((last - first) / 1e9)
    assert 2_000_000 <= goodput_bps <= 4_500_000
    queue_drops = after["queue_dropped_packets"] - before["queue_dropped_packets"]
    assert queue_drops >= flow.sent // 2  # most of a 12x overload is dropped at the bottleneck
    assert after["forwarded_packets"] - before["forwarded_packets"] >= flow.received


def test_uplink_is_shaped_independently(fresh: Lab) -> None:
    fresh.set_uplink(Link(rate_bps=1_000_000, queue_ms=50))
    up = run_flow(fresh, "up", rate_bps=5_000_000, count=800)
    down = run_flow(fresh, "down", rate_bps=5_000_000, count=800)
    assert down.received == 800
    assert up.received < 800 * 0.5  # 1 Mbit of 5 Mbit offered, plus a 50 ms buffer


def test_loss_drops_about_the_configured_share(fresh: Lab) -> None:
    fresh.set_downlink(Link(loss_percent=20.0))
    before = fresh.counters()["downlink"]["loss_dropped_packets"]
    flow = run_flow(fresh, "down", rate_bps=10_000_000, count=2000)
    dropped = fresh.counters()["downlink"]["loss_dropped_packets"] - before
    lost = flow.sent - flow.received
    assert 200 <= lost <= 600  # 10-30 % of 2000
    assert dropped <= lost <= dropped + 20  # the loss rule accounts for (nearly) all of it


def test_delay_in_each_direction(fresh: Lab) -> None:
    fresh.set_downlink(Link(delay_ms=40))
    fresh.set_uplink(Link(delay_ms=25))
    down = run_flow(fresh, "down", rate_bps=1_000_000, count=100).one_way_ms()
    up = run_flow(fresh, "up", rate_bps=1_000_000, count=100).one_way_ms()
    assert down[0] >= 40.0 and pct(down, 50) < 40.0 + 150.0
    assert up[0] >= 25.0 and pct(up, 50) < 25.0 + 150.0
    assert down[0] + up[0] >= 65.0  # the round trip carries both


def test_jitter_spreads_delay_without_reordering(fresh: Lab) -> None:
    fresh.set_downlink(Link(delay_ms=30, jitter_ms=10))
    # 1228-byte packets at ~1 Mbit/s: one every ~10 ms, about the jitter's half-width.
    flow = run_flow(fresh, "down", rate_bps=1_000_000, count=150)
    owd = flow.one_way_ms()
    assert flow.received == 150
    assert flow.reordered() == 0
    assert owd[0] >= 20.0  # delay - jitter
    assert pct(owd, 95) - pct(owd, 5) > 8.0  # uniform +-10 ms spans ~18 ms between p5 and p95


def test_scripted_scenario_changes_rate_live(fresh: Lab) -> None:
    fresh.set_downlink(Link(rate_bps=4_000_000, queue_ms=100))
    receiver = fresh.popen(
        "viewer", [sys.executable, PROBE, "recv", f"--port={PORT}", "--idle=0.6"], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == "READY"
    sender = fresh.popen(
        "node",
        [
            sys.executable,
            PROBE,
            "send",
            f"--dst={fresh.viewer_ip}",
            f"--port={PORT}",
            "--rate-bps=8000000",
            f"--size={SIZE}",
            "--count=3700",
        ],  # ~4.5 s at 8 Mbit/s, twice what any phase lets through
        stdout=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    applied = fresh.play([Step(1.5, downlink=Link(rate_bps=1_000_000)), Step(3.0, downlink=Link(rate_bps=3_000_000))])
    sender.communicate(timeout=60)
    flow = Flow(sent=3700, records=json.loads(receiver.communicate(timeout=60)[0])["records"])
    assert len(applied) == 2 and applied[0] >= t0 + 1.5 and applied[1] >= t0 + 3.0
    assert fresh.downlink == Link(rate_bps=3_000_000)
    ns = [int(t * 1e9) for t in (t0, *applied)]
    s = 1_000_000_000
    phase_4m = flow.rate_bps(ns[0] + s // 2, ns[1])
    phase_1m = flow.rate_bps(ns[1] + s // 2, ns[2])  # past the 4 Mbit backlog (50 kB = 0.4 s at 1 Mbit)
    phase_3m = flow.rate_bps(ns[2] + s // 4, ns[2] + 5 * s // 4)
    assert 2_500_000 <= phase_4m <= 4_500_000
    assert 400_000 <= phase_1m <= 1_300_000
    assert 1_800_000 <= phase_3m <= 3_400_000


def test_reorder_flag_lets_jitter_reorder() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"netem lab unavailable: {reason}")
    with Lab(Link(delay_ms=20, jitter_ms=15), reorder=True) as lab:
        flow = run_flow(lab, "down", rate_bps=5_000_000, count=300)  # one every ~2 ms
    assert flow.received == 300
    assert flow.reordered() > 10


def _root_state() -> dict[str, Any]:
    def out(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

    return {
        "links": sorted(line.split(":")[1].strip() for line in out(["ip", "-o", "link"]).splitlines()),
        "nft": out(["nft", "list", "ruleset"]),
        "iptables": out(["iptables", "-S"]) + out(["iptables", "-t", "mangle", "-S"]),
        "qdiscs": out(["tc", "qdisc", "show"]),
    }


def test_close_removes_every_namespace_rule_and_process() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"netem lab unavailable: {reason}")
    root_before = _root_state()
    lab = Lab(Link(rate_bps=2_000_000, delay_ms=10, loss_percent=1.0))
    names = {lab.node_ns, lab.router_ns, lab.viewer_ns}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert names <= {line.split()[0] for line in listed.splitlines() if line.strip()}
    sleeper = lab.popen("node", ["sleep", "600"])
    emulator = lab._emulator
    assert emulator is not None
    assert _root_state() == root_before  # nothing of ours in the root namespace, even while open
    lab.close()
    lab.close()  # idempotent
    assert sleeper.poll() is not None and emulator.proc.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not names & {line.split()[0] for line in listed.splitlines() if line.strip()}
    root_after = _root_state()
    assert root_after == root_before
    assert NFT_TABLE not in root_after["nft"] and "NFQUEUE" not in root_after["iptables"]
    assert f"{NS_PREFIX}" not in "".join(root_after["links"])
    with pytest.raises(LabError):
        lab.set_downlink(Link())


def test_stale_namespaces_of_dead_processes_are_swept() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"netem lab unavailable: {reason}")
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is now free (reuse within this test is vanishingly unlikely)
    stale = f"{NS_PREFIX}{dead.pid}x1-router"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        assert stale in sweep_stale_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True, check=False)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert stale not in listed
