"""The autoscaler end to end: a broker app with the local provider starting real ``render-node`` processes.

One pool, one host per node process (``--seats 1``, built-in game at 320x240), the app's own
autoscaler loop (every 0.2 s) and a scaling plan whose phase is chosen by the fake clock the
broker gets (``create_app(clock=...)``: the scaler reads "now" from ``Broker.clock``):

1. peak: the plan's minimum starts the first node; each arriving session pushes used capacity
   over the threshold and the scaler starts another node -- real processes that register;
2. off-peak: the scaler drains the empty nodes and stops them (process exited, host gone) while
   the node with a session keeps running it and an aiortc viewer keeps decoding its frames --
   the game's frame stamps keep counting up, so its runtime was never restarted;
3. ramp-up: the phase's minimum brings the pool back to two hosts.

Waits poll a condition with a deadline (the machine is shared and slow); nothing sleeps to let
state settle.  Every node process is stopped when the app closes (the provider's ``close``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.autoscale.plans import DAYS
from broker.autoscale.providers import DEFAULT_NODE_COMMAND, LocalNode, LocalProvider
from broker.embedded import free_port
from broker.http.plans import SCALER
from streamer.desktop.game import read_stamp
from tests.broker.autoscale.test_providers import alive
from tests.broker.autoscale.test_scaler import at
from tests.conftest import ADMIN, auth, user_token
from tests.streamer.node.test_node_e2e import BrokerSignal
from tests.streamer.viewer import Viewer

pytestmark = pytest.mark.e2e

POOL = "auto"
MAX_HOSTS = 3
DEADLINE_S = 45.0  # bound for one node to boot and register, or one session to start, on a loaded machine
NODE_COMMAND = [*DEFAULT_NODE_COMMAND, "--seats", "1", "--advertise-addresses", "127.0.0.1",
                "--heartbeat-interval-s", "0.5", "--log-level", "info"]
PROFILE = {"width": 320, "height": 240, "fps": 15, "codec": "h264"}


def phase(start: str, strategy: str, threshold: float, min_pct: float) -> dict[str, Any]:
    return {"start": start, "strategy": strategy, "capacity_threshold_pct": threshold, "min_hosts_pct": min_pct}


# ramp-up keeps ceil(50 % of 3) = 2 hosts, peak 1 and scales out above 50 %; ramp-down/off-peak
# keep none and (margin 0) drain while the hosts left stay at or under 100 %
PLAN = {"name": "local-e2e", "time_zone": "UTC", "scale_in_cooldown_min": 0, "undrain_hold_min": 0,
        "scale_in_margin_pct": 0,
        "schedules": [{"days": list(DAYS), "scale_in_mode": "zero_sessions",
                       "ramp_up": phase("07:00", "breadth-first", 100, 50),
                       "peak": phase("09:00", "breadth-first", 50, 30),
                       "ramp_down": phase("18:00", "depth-first", 100, 0),
                       "off_peak": phase("20:00", "depth-first", 100, 0)}]}


async def until(cond: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``cond`` (sync or async) until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(0.05)


async def test_pool_scales_out_then_in_at_off_peak_without_touching_a_streaming_session_and_back_at_ramp_up(
        aiohttp_client, settings_factory, clock) -> None:
    from broker.app import create_app

    port = free_port()
    settings = settings_factory(host_provider="local", port=port, local_node_command=NODE_COMMAND,
                                local_stop_timeout_s=5, autoscale_interval_s=0.2, autoscale_max_hosts=MAX_HOSTS)
    at(clock, 2025, 12, 2, 10, 0)  # a Tuesday, peak
    api = await aiohttp_client(create_app(settings, clock=clock), server_kwargs={"port": port})
    prov = api.app[SCALER].provider
    assert isinstance(prov, LocalProvider) and prov.broker_url == f"http://127.0.0.1:{port}"
    seen: dict[str, LocalNode] = {}  # every node the provider started, kept to check its process later

    async def up_hosts() -> dict[str, dict[str, Any]]:
        """Registered, alive, ``up`` hosts of the pool; also notes the provider's nodes."""
        seen.update(prov.nodes)
        r = await api.get(f"/api/v1/hosts?pool={POOL}", headers=auth(ADMIN))
        return {h["id"]: h for h in (await r.json())["hosts"] if h["state"] == "up" and h["alive"]}

    async def wait_hosts(n: int, what: str) -> dict[str, dict[str, Any]]:
        async def check() -> dict[str, dict[str, Any]] | None:
            hosts = await up_hosts()
            return hosts if len(hosts) == n and set(hosts) == set(prov.nodes) else None
        hosts: dict[str, dict[str, Any]] = await until(check, what)
        assert all(alive(seen[h].proc.pid) for h in hosts)  # each host is a live render-node process
        return hosts

    async def new_session(user: str) -> tuple[str, dict[str, Any]]:
        tok = await user_token(api, user)
        r = await api.post("/api/v1/sessions", json={"pool": POOL, "profile": PROFILE}, headers=auth(tok))
        assert r.status == 201, await r.text()
        return tok, await r.json()

    async def running(sid: str, tok: str) -> dict[str, Any]:
        """Wait until the node runs the session (``disconnected`` until a viewer connects)."""
        async def check() -> dict[str, Any] | None:
            s: dict[str, Any] = await (await api.get(f"/api/v1/sessions/{sid}", headers=auth(tok))).json()
            assert s["state"] != "ended", s
            return s if s["state"] in ("running", "disconnected") else None
        s: dict[str, Any] = await until(check, f"session {sid} to run")
        return s

    async def decisions() -> list[tuple[str, str, str | None]]:
        r = await api.get(f"/api/v1/pools/{POOL}/autoscale?limit=100", headers=auth(ADMIN))
        rows = (await r.json())["decisions"]
        return [(d["kind"], d["reason"], d["phase"]) for d in reversed(rows) if d["kind"] != "set_strategy"]

    viewer = Viewer()
    try:
        r = await api.put(f"/api/v1/pools/{POOL}", headers=auth(ADMIN), json={
            "kind": "game", "strategy": "breadth-first", "max_sessions_per_gpu": 1, "vram_per_session_mb": 1024})
        assert r.status == 201, await r.text()
        r = await api.put(f"/api/v1/pools/{POOL}/plan", json=PLAN, headers=auth(ADMIN))
        assert r.status == 201, await r.text()

        # --- 1. peak: the minimum starts one node; each session over the threshold starts another ---
        [a] = await wait_hosts(1, "the first node (peak minimum) to register")
        tok1, s1 = await new_session("u1")
        assert s1["host"] == a  # 1 of 1 seat used: 100 % > 50 %
        b = next(iter(set(await wait_hosts(2, "a second node for the first session")) - {a}))
        await running(s1["id"], tok1)
        tok2, s2 = await new_session("u2")
        assert s2["host"] == b  # 2 of 2 seats: another node, the last one max_hosts allows
        hosts = await wait_hosts(3, "a third node for the second session")
        [c] = set(hosts) - {a, b}
        s2 = await running(s2["id"], tok2)
        assert await decisions() == [("start_hosts", "below_min_hosts", "peak"),
                                     ("start_hosts", "above_threshold", "peak"),
                                     ("start_hosts", "above_threshold", "peak")]

        # a viewer on u2's session (on b) streams through the broker's signaling
        async with api.ws_connect(f"/api/v1/sessions/{s2['id']}/signal?access_token={tok2}") as ws:
            await viewer.connect(BrokerSignal(ws))
            await viewer.wait_frames(15)
            pc_states: list[str] = []  # any change of the viewer's connection from here on
            viewer.pc.on("connectionstatechange", lambda: pc_states.append(viewer.pc.connectionState))
            stamp_before = read_stamp(viewer.images[-1])
            assert stamp_before is not None
            # u1 leaves: its node a is now as empty as c
            assert (await api.delete(f"/api/v1/sessions/{s1['id']}", headers=auth(tok1))).status == 200

            # --- 2. off-peak: drain and stop the empty nodes; b and its viewer are left alone -----------
            frames_at_switch = len(viewer.frames)
            procs = {h: seen[h].proc for h in (a, b, c)}
            at(clock, 2025, 12, 2, 22, 0)
            await until(lambda: procs[a].returncode is not None and procs[c].returncode is not None,
                        "the empty nodes' processes to exit")
            assert set(await up_hosts()) == {b} and set(prov.nodes) == {b}
            r = await api.get(f"/api/v1/hosts/{a}", headers=auth(ADMIN))
            assert r.status == 404  # deregistered, and it never came back
            assert procs[b].returncode is None and alive(procs[b].pid)
            # the stream went on across the scale-in (drain, then a pass later the stops: frames were
            # decoded meanwhile) and still goes on, on the same connection and the same game clock
            frames_after_stop = len(viewer.frames)
            assert frames_after_stop > frames_at_switch
            await viewer.wait_frames(15, after=frames_after_stop)
            stamp_after = read_stamp(viewer.images[-1])
            assert stamp_after is not None and stamp_after.frame_no > stamp_before.frame_no
            assert viewer.pc.connectionState == "connected" and pc_states == []
            s2_now = await (await api.get(f"/api/v1/sessions/{s2['id']}", headers=auth(tok2))).json()
            assert (s2_now["state"], s2_now["host"], s2_now["started_ms"]) == ("running", b, s2["started_ms"])
            off_peak = [d for d in await decisions() if d[2] == "off_peak"]
            assert sorted(off_peak) == [("drain", "scale_in", "off_peak")] * 2 + [
                ("stop_host", "drained_empty", "off_peak")] * 2

            # --- 3. ramp-up: back to the phase's minimum of two hosts ------------------------------------
            at(clock, 2025, 12, 3, 7, 30)
            hosts = await wait_hosts(2, "ramp-up to start a node back to its minimum")
            assert b in hosts and not {a, c} & set(hosts)
            assert (await decisions())[-1] == ("start_hosts", "below_min_hosts", "ramp_up")
            await viewer.wait_frames(15, after=len(viewer.frames))
            assert pc_states == []
        s2_now = await (await api.get(f"/api/v1/sessions/{s2['id']}", headers=auth(tok2))).json()
        assert s2_now["host"] == b and s2_now["state"] in ("running", "disconnected")
    finally:
        await viewer.close()
        started = list(seen.values()) + list(prov.nodes.values())
        # what the app's cleanup does too, done first: a node holding its command socket open
        # would keep the test server's graceful shutdown waiting (its timeout is 60 s)
        await prov.close()
        await api.close()
        for node in started:
            assert node.proc.returncode is not None and not alive(node.proc.pid), f"{node.host_id} outlived the app"
