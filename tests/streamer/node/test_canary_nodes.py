"""Canary rollout with real processes: a broker and two ``render-node`` processes of different versions in one pool.

``stable-0`` reports version 1.4.0 (``--version``, env ``NODE_VERSION``) and runs the built-in game;
``canary-0`` reports the candidate version. In the first case the candidate is broken the way a bad image is:
its game command (the build's launcher) does not exist, so every session it is given really fails to start in
the node (Xvfb comes up, the app cannot be run, the node reports ``ended`` / ``start_failed``). The broker's
own rollout loop (every 0.5 s here, ``BROKER_ROLLOUT_INTERVAL_S``) must roll it back with no admin: candidate
host drained (audited), rollout ``rolled_back`` (audited with the figures), the rollback gauge and counter
exported, the stable sessions still streaming to a real aiortc viewer, new sessions on the stable host, no
seat leaked. In the second case the candidate is healthy and the same loop promotes it once ``min_sessions``
candidate sessions ran and the (1 s) soak is over.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conftest import ADMIN, auth
from tests.procs import broker_process
from tests.streamer.node.test_node_e2e import BrokerSignal, broker_env, node_process, wait_host, wait_state
from tests.streamer.viewer import Viewer

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (the candidate's "
                                                                      "sessions fail after their display starts)")]

POOL = "game"
STABLE, CANDIDATE = "1.4.0", "1.5.0-rc1"
PROFILE = {"width": 320, "height": 240, "fps": 15}
SEATS = 3  # per node: two stable sessions, then one seated after the verdict
ROLLOUT_INTERVAL_S = 0.5  # the broker's judging loop, short so the verdict comes within the test
POLICY = {"candidate_version": CANDIDATE, "share_pct": 50, "min_sessions": 2, "max_start_failure_pct": 10}
LIVE = {"running", "disconnected"}  # started; "disconnected" while no viewer is connected (node heartbeats say so)
RULES = Path(__file__).resolve().parents[3] / "infra" / "prometheus" / "render-broker.rules.yml"


@pytest.fixture
async def canary_system(redis_url: str, prefix: str,
                        tmp_path: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    env = {**broker_env(redis_url, prefix, tmp_path), "BROKER_ROLLOUT_INTERVAL_S": str(ROLLOUT_INTERVAL_S)}
    async with broker_process(env, str(tmp_path / "broker.log")) as b, aiohttp.ClientSession() as http:
        async with http.put(f"{b.url}/api/v1/pools/{POOL}", json={"kind": "game", "max_sessions_per_gpu": SEATS,
                                                                  "vram_per_session_mb": 1},
                            headers=auth(ADMIN)) as r:
            assert r.status == 201, await r.text()
        yield b.url, http


async def call(http: aiohttp.ClientSession, method: str, url: str, path: str, body: Any = None,
               token: str = ADMIN) -> tuple[int, Any]:
    async with http.request(method, f"{url}/api/v1{path}", json=body, headers=auth(token)) as r:
        return r.status, await r.json(content_type=None)


async def seat(http: aiohttp.ClientSession, url: str, user: str) -> tuple[str, dict[str, Any]]:
    """A user's session in the pool, once its node reports it started or ended: (token, session)."""
    _, tok = await call(http, "POST", url, "/tokens", {"user": user})
    status, s = await call(http, "POST", url, "/sessions", {"pool": POOL, "profile": PROFILE}, tok["token"])
    assert status == 201, s
    return tok["token"], await wait_state(http, url, s["id"], tok["token"], {*LIVE, "ended"})


def placed(seated: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(host, "live" | "ended") of each session."""
    return [(s["host"], "live" if s["state"] in LIVE else s["state"]) for _, s in seated]


async def state(http: aiohttp.ClientSession, url: str, tok: str, s: dict[str, Any]) -> tuple[str, str]:
    """A session's (host, state) now."""
    _, now = await call(http, "GET", url, f"/sessions/{s['id']}", token=tok)
    return now["host"], now["state"]


async def until_rollout(http: aiohttp.ClientSession, url: str, done: Any, what: str) -> tuple[int, Any]:
    """Poll the pool's rollout until ``done(status, body)``: the broker's loop decides, nobody else."""
    deadline = time.monotonic() + 20
    while True:
        status, body = await call(http, "GET", url, f"/pools/{POOL}/rollout")
        if done(status, body):
            return status, body
        assert time.monotonic() < deadline, f"{what}: still {status} {body}"
        await asyncio.sleep(0.1)


async def metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as r:
        return await r.text()


async def test_a_candidate_whose_sessions_cannot_start_is_rolled_back_by_the_broker(canary_system,
                                                                                   tmp_path: Path) -> None:
    url, http = canary_system
    missing = tmp_path / "game-1.5.0-rc1"  # the candidate image's game launcher, absent
    async with node_process(url, POOL, "stable-0", tmp_path / "stable.log", seats=SEATS,
                            extra=("--version", STABLE)), \
            node_process(url, POOL, "canary-0", tmp_path / "canary.log", seats=SEATS,
                         extra=("--version", CANDIDATE, "--game-command", str(missing))):
        assert (await wait_host(http, url, "stable-0"))["version"] == STABLE
        assert (await wait_host(http, url, "canary-0"))["version"] == CANDIDATE
        assert (await call(http, "PUT", url, f"/pools/{POOL}/rollout", {**POLICY, "min_soak_s": 3600}))[0] == 201

        # n-th seating prefers the candidate when floor(n/2) grows: stable, candidate, stable, candidate
        seated = [await seat(http, url, f"u{i}") for i in range(4)]
        assert placed(seated) == [("stable-0", "live"), ("canary-0", "ended"), ("stable-0", "live"),
                                  ("canary-0", "ended")]
        stable = [(tok, s) for tok, s in seated if s["host"] == "stable-0"]

        viewer = Viewer(keep_images=False)  # a real viewer on a stable session, across the verdict
        tok, s = stable[0]
        async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={tok}") as ws:
            await viewer.connect(BrokerSignal(ws))
            await viewer.wait_frames(5)

            _, view = await until_rollout(http, url, lambda st, b: st == 200 and b["state"] == "rolled_back",
                                          "the broker never rolled the candidate back")
            # the verdict and the figures behind it: two of two candidate starts failed, stable ran its two
            assert view["last"]["action"] == "rollback" and view["last"]["reason"] == "start_failures"
            assert view["last"]["candidate"]["start_failed"] == 2 and view["last"]["candidate"]["sessions"] == 2
            assert view["last"]["stable"]["started"] == 2 and view["last"]["stable"]["start_failed"] == 0
            assert view["split"]["share_pct"] == 0 and view["candidate_hosts"] == ["canary-0"]

            after = len(viewer.frames)
            await viewer.wait_frames(10, after=after)  # the stable session streams on through the rollback
            assert await state(http, url, tok, s) == ("stable-0", "running")
            # and no stable session was touched (the one nobody watches is started, its viewer gone or not yet come)
            assert [(await state(http, url, t, x))[1] in LIVE for t, x in stable] == [True, True]
        await viewer.close()

        # the candidate host is drained, by the rollout loop, with the reason; the stable one is not
        _, hosts = await call(http, "GET", url, "/hosts")
        assert {h["id"]: h["state"] for h in hosts["hosts"]} == {"stable-0": "up", "canary-0": "draining"}
        _, audit = await call(http, "GET", url, "/audit?limit=200")
        [drain] = [e for e in audit["entries"] if e["action"] == "host.drain"]
        assert drain["target"] == "canary-0" and drain["actor"] == "rollout"
        assert drain["detail"]["reason"].startswith(f"canary rollback of {CANDIDATE}: start_failures")
        [rb] = [e for e in audit["entries"] if e["action"] == "rollout.rollback"]
        assert rb["actor"] == "rollout" and rb["target"] == POOL
        assert rb["detail"]["version"] == CANDIDATE and rb["detail"]["drained"] == ["canary-0"]
        assert not [e for e in audit["entries"] if e["action"] == "rollout.promote"]

        # the rollback gauge (what RenderBrokerCanaryRolledBack watches) and the decision counter
        text = await metrics(http, url)
        assert f'render_broker_rollout_rolled_back{{pool="{POOL}"}} 1.0' in text
        assert f'render_broker_rollout_decisions_total{{action="rollback",pool="{POOL}"}} 1.0' in text
        [rule] = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                  if r.get("alert") == "RenderBrokerCanaryRolledBack"]
        assert "render_broker_rollout_rolled_back" in rule["expr"] and rule["expr"].endswith("== 1")

        # the candidate really failed in the node: its display came up, the app could not be run
        log = (tmp_path / "canary.log").read_text()
        assert log.count("failed to start") == 2 and f"cannot run app '{missing}'" in log

        # SQL history has the two failed starts, on the candidate's version
        _, history = await call(http, "GET", url, f"/sessions/history?pool={POOL}")
        assert sorted((h["end_reason"], h["host_version"]) for h in history["sessions"]) == [
            ("start_failed", CANDIDATE)] * 2

        # a new session goes to the stable host; no seat is held by anything but a live session
        assert placed([await seat(http, url, "after")]) == [("stable-0", "live")]
        _, pool = await call(http, "GET", url, f"/pools/{POOL}")
        _, listing = await call(http, "GET", url, f"/sessions?pool={POOL}")
        live = [x for x in listing["sessions"] if x.get("host")]
        assert pool["seats_used"] == len(live) == 3 and {x["host"] for x in live} == {"stable-0"}
        _, canary = await call(http, "GET", url, "/hosts/canary-0")
        assert canary["seats_used"] == 0 and canary["sessions"] == []


async def test_a_healthy_candidate_is_promoted_by_the_broker(canary_system, tmp_path: Path) -> None:
    url, http = canary_system
    async with node_process(url, POOL, "stable-0", tmp_path / "stable.log", seats=SEATS,
                            extra=("--version", STABLE)), \
            node_process(url, POOL, "canary-0", tmp_path / "canary.log", seats=SEATS,
                         extra=("--version", CANDIDATE)):
        await wait_host(http, url, "stable-0")
        await wait_host(http, url, "canary-0")
        assert (await call(http, "PUT", url, f"/pools/{POOL}/rollout", {**POLICY, "min_soak_s": 1}))[0] == 201
        first = await seat(http, url, "u0")
        status, view = await call(http, "GET", url, f"/pools/{POOL}/rollout")
        assert status == 200 and view["state"] == "active"  # no candidate outcome yet: nothing to promote on
        seated = [first, *[await seat(http, url, f"u{i}") for i in range(1, 4)]]
        assert placed(seated) == [("stable-0", "live"), ("canary-0", "live")] * 2

        await until_rollout(http, url, lambda st, _b: st == 404, "the broker never promoted the healthy candidate")
        _, audit = await call(http, "GET", url, "/audit?limit=200")
        [promote] = [e for e in audit["entries"] if e["action"] == "rollout.promote"]
        assert promote["actor"] == "rollout" and promote["detail"]["version"] == CANDIDATE
        assert promote["detail"]["reason"] == "healthy" and "2 candidate sessions" in promote["detail"]["detail"]
        assert not [e for e in audit["entries"] if e["action"] in ("rollout.rollback", "host.drain")]
        text = await metrics(http, url)
        assert f'render_broker_rollout_decisions_total{{action="promote",pool="{POOL}"}} 1.0' in text
        assert f'render_broker_rollout_rolled_back{{pool="{POOL}"}} 1.0' not in text
        _, hosts = await call(http, "GET", url, "/hosts")
        assert {h["id"]: h["state"] for h in hosts["hosts"]} == {"stable-0": "up", "canary-0": "up"}
        assert placed([(tok, (await call(http, "GET", url, f"/sessions/{s['id']}", token=tok))[1])
                       for tok, s in seated]) == placed(seated)  # every session lives on, on both versions
