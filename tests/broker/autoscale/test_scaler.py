"""The autoscaler service on a real Redis + SQLite broker, driven by the fake clock, one pass at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime

import pytest

from broker.autoscale.plans import DEFAULT_PLAN
from broker.autoscale.policy import HOST_STARTING, StopHost
from broker.autoscale.providers import HostProvider
from broker.autoscale.scaler import Outcome, Record, Scaler, build_snapshot, history_forecast, sizing_report
from broker.autoscale.simulate import SimConfig, synthetic_demand
from broker.http.plans import SCALER
from broker.keys_app import BROKER
from broker.models import PoolConfig
from broker.placement import GpuLoad, HostLoad
from tests.conftest import ADMIN, NODE, auth, gpu, setup_pool, user_token

DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def plan_body(*, mode: str = "zero_sessions", wait_min: int = 15, up_min: float = 0, down_min: float = 0,
              up_threshold: float = 60, down_threshold: float = 90) -> dict:
    """Every day: ramp-up 07:00, peak 09:00, ramp-down 18:00, off-peak 20:00 (UTC)."""
    def phase(start: str, strategy: str, threshold: float, min_pct: float) -> dict:
        return {"start": start, "strategy": strategy, "capacity_threshold_pct": threshold, "min_hosts_pct": min_pct}

    return {"name": "test", "time_zone": "UTC", "scale_in_cooldown_min": 0, "undrain_hold_min": 0,
            "scale_in_margin_pct": 10,
            "schedules": [{"days": DAYS, "scale_in_mode": mode, "logoff_wait_min": wait_min,
                           "logoff_message": "Scaling in: your session ends in {minutes} minutes.",
                           "ramp_up": phase("07:00", "breadth-first", up_threshold, up_min),
                           "peak": phase("09:00", "breadth-first", up_threshold, up_min),
                           "ramp_down": phase("18:00", "depth-first", down_threshold, down_min),
                           "off_peak": phase("20:00", "depth-first", down_threshold, down_min)}]}


def at(clock, y: int, mo: int, d: int, h: int, mi: int = 0) -> None:  # type: ignore[no-untyped-def]
    clock.now_ms = int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


async def put_plan(api, pool: str, body: dict) -> None:  # type: ignore[no-untyped-def]
    r = await api.put(f"/api/v1/pools/{pool}/plan", json=body, headers=auth(ADMIN))
    assert r.status in (200, 201), await r.text()


async def new_session(api, user: str, pool: str = "p1") -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    tok = await user_token(api, user)
    r = await api.post("/api/v1/sessions", json={"pool": pool}, headers=auth(tok))
    assert r.status == 201, await r.text()
    return tok, await r.json()


async def host_states(api, pool: str = "p1") -> dict[str, tuple[str, int]]:  # type: ignore[no-untyped-def]
    hosts = (await (await api.get(f"/api/v1/hosts?pool={pool}", headers=auth(ADMIN))).json())["hosts"]
    return {h["id"]: (h["state"], len(h["sessions"])) for h in hosts}


def kinds(ev) -> list[tuple[str, str | None, str]]:  # type: ignore[no-untyped-def]
    return [(a.kind, a.host, a.outcome) for a in ev.applied]


class FakeProvider(HostProvider):
    """A provider that remembers what it was asked; hosts 'boot' when the test registers them."""

    name = "fake"

    def __init__(self) -> None:
        self.running: dict[str, str] = {}  # host id -> pool
        self.started: list[tuple[str, int]] = []
        self.stopped: list[str] = []
        self.seq = 0

    async def start_hosts(self, pool: str, n: int) -> list[str]:
        self.started.append((pool, n))
        ids = []
        for _ in range(n):
            self.seq += 1
            ids.append(f"{pool}-new{self.seq}")
            self.running[ids[-1]] = pool
        return ids

    async def stop_host(self, pool: str, host_id: str) -> None:
        self.stopped.append(host_id)
        self.running.pop(host_id, None)

    async def list_hosts(self, pool: str) -> list[str]:
        return sorted(h for h, p in self.running.items() if p == pool)


@pytest.fixture
async def api(aiohttp_client, settings_factory, clock):  # type: ignore[no-untyped-def]
    """A broker whose autoscaler loop is off: tests run passes themselves."""
    from broker.app import create_app

    return await aiohttp_client(create_app(settings_factory(autoscale_interval_s=0), clock=clock))


async def test_static_scale_in_drains_least_loaded_at_off_peak_and_undrains_at_ramp_up(api, clock) -> None:
    await setup_pool(api, "p1", hosts=3, max_sessions_per_gpu=2)
    await put_plan(api, "p1", plan_body(up_min=100, down_min=0))
    scaler = api.app[SCALER]
    at(clock, 2025, 12, 2, 17, 0)  # peak: every host stays
    await new_session(api, "u1")
    await new_session(api, "u2")
    assert {h: n for h, (_, n) in (await host_states(api)).items()} == {"p1-h0": 1, "p1-h1": 1, "p1-h2": 0}
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ev.phase == "peak" and kinds(ev) == []

    at(clock, 2025, 12, 2, 22, 0)  # off-peak: 2 sessions on 6 seats; only the empty host can go
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ev.phase == "off_peak"
    assert kinds(ev) == [("set_strategy", None, "applied"), ("drain", "p1-h2", "applied")]
    assert [a.reason for a in ev.applied] == ["phase_strategy", "scale_in"]
    pool = await (await api.get("/api/v1/pools/p1", headers=auth(ADMIN))).json()
    assert pool["strategy"] == "depth-first"
    assert await host_states(api) == {"p1-h0": ("up", 1), "p1-h1": ("up", 1), "p1-h2": ("draining", 0)}

    clock.advance(5 * 60_000)  # the drained host is empty: a static inventory cannot stop it, so it idles
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and kinds(ev) == [("stop_host", "p1-h2", "skipped")]
    assert await host_states(api) == {"p1-h0": ("up", 1), "p1-h1": ("up", 1), "p1-h2": ("draining", 0)}
    ev = await scaler.evaluate_pool("p1")  # nothing with sessions is ever touched
    assert ev is not None and all(a.host != "p1-h0" and a.host != "p1-h1" for a in ev.applied)

    at(clock, 2025, 12, 3, 7, 30)  # ramp-up keeps 100 % of hosts available: undrain
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ev.phase == "ramp_up"
    assert kinds(ev) == [("set_strategy", None, "applied"), ("undrain", "p1-h2", "applied")]
    assert ev.applied[1].reason == "below_min_hosts"
    assert await host_states(api) == {"p1-h0": ("up", 1), "p1-h1": ("up", 1), "p1-h2": ("up", 0)}

    # SQL has every applied decision with its reason, newest first; skipped ones are not logged there
    r = await api.get("/api/v1/pools/p1/autoscale", headers=auth(ADMIN))
    assert r.status == 200
    view = await r.json()
    assert view["enabled"] and view["provider"] == "static" and view["phase"]["name"] == "ramp_up"
    assert [(d["kind"], d["host"], d["reason"], d["phase"]) for d in view["decisions"]] == [
        ("undrain", "p1-h2", "below_min_hosts", "ramp_up"), ("set_strategy", None, "phase_strategy", "ramp_up"),
        ("drain", "p1-h2", "scale_in", "off_peak"), ("set_strategy", None, "phase_strategy", "off_peak")]
    assert view["decisions"][0]["detail"]["outcome"] == "applied" and "ramp_up" in view["decisions"][0]["detail"][
        "detail"]
    assert view["last_evaluation"]["decisions"][1]["kind"] == "undrain"
    audit = (await (await api.get("/api/v1/audit?action=host.drain", headers=auth(ADMIN))).json())["entries"]
    assert [(e["actor"], e["target"]) for e in audit] == [("autoscaler", "p1-h2")]


async def test_state_is_persisted_in_redis_with_a_ttl_and_another_replica_continues(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=2)
    await put_plan(api, "p1", plan_body(down_min=50))  # one of the two hosts stays available
    at(clock, 2025, 12, 2, 22, 0)
    b = api.app[BROKER]
    first = api.app[SCALER]
    ev = await first.evaluate_pool("p1")
    assert ev is not None and ("drain", "p1-h0", "applied") in kinds(ev)
    key = b.live.keys.autoscale("p1")
    ttl = await b.live.redis.ttl(key)
    assert 6 * 86_400 < ttl <= 7 * 86_400
    rec = Record.from_json(await b.live.redis.get(key))
    assert set(rec.state.drained) == {"p1-h0"} and rec.state.phase == "off_peak"
    # another replica cannot act while the first holds the pool's lock ...
    other = Scaler(b, first.provider, b.settings, owner="replica-2")
    assert await other.evaluate_pool("p1") is None
    # ... and when the lock is gone it continues from the persisted state (knows p1-h0 is its drain)
    await b.live.redis.delete(b.live.keys.lock("autoscale:p1"))
    clock.advance(60_000)
    ev = await other.evaluate_pool("p1")
    assert ev is not None and kinds(ev) == [("stop_host", "p1-h0", "skipped")]


async def test_scale_out_starts_hosts_when_usage_passes_the_threshold(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=2)
    await put_plan(api, "p1", plan_body(up_threshold=50))
    b = api.app[BROKER]
    fake = FakeProvider()
    scaler = Scaler(b, fake, b.settings)
    at(clock, 2025, 12, 2, 10, 0)  # peak
    await new_session(api, "u1")
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and fake.started == []  # 1 of 2 seats = 50 %: not above the threshold
    await new_session(api, "u2")  # 100 % > 50 %: two more seats needed = one host
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and fake.started == [("p1", 1)]
    [start] = [a for a in ev.applied if a.kind == "start_hosts"]
    assert (start.count, start.reason, start.outcome, start.info["hosts"]) == (1, "above_threshold", "applied",
                                                                               ["p1-new1"])
    # the new host boots: it is "starting" (counted as coming capacity), so nothing more is started
    clock.advance(60_000)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and fake.started == [("p1", 1)]
    rec = await scaler.load_record("p1")
    assert set(rec.starting) == {"p1-new1"}
    assert ("p1-new1", HOST_STARTING) in {(h["host_id"], h["state"]) for h in rec.last["hosts"]}
    # it registers: up, no longer starting; 2 sessions on 4 seats is 50 %: still nothing to start
    r = await api.post("/api/v1/hosts", json={"id": "p1-new1", "pool": "p1", "address": "10.0.0.9:7000",
                                              "gpus": [gpu(0)]}, headers=auth(NODE))
    assert r.status == 201
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and fake.started == [("p1", 1)] and (await scaler.load_record("p1")).starting == {}
    rows = (await (await api.get("/api/v1/pools/p1/autoscale", headers=auth(ADMIN))).json())["decisions"]
    assert [(d["kind"], d["count"], d["reason"]) for d in rows] == [("start_hosts", 1, "above_threshold")]


async def test_a_started_host_that_never_registers_is_stopped_after_the_boot_timeout(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1)
    await put_plan(api, "p1", plan_body(up_threshold=50))
    b = api.app[BROKER]
    fake = FakeProvider()
    scaler = Scaler(b, fake, b.settings)
    at(clock, 2025, 12, 2, 10, 0)
    await new_session(api, "u1")
    await scaler.evaluate_pool("p1")
    assert fake.started == [("p1", 1)]
    clock.advance(int(b.settings.autoscale_boot_timeout_s * 1000))
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ev.applied[0].kind == "stop_host" and ev.applied[0].reason == "boot_timeout"
    assert fake.stopped == ["p1-new1"] and fake.started == [("p1", 1), ("p1", 1)]  # and a replacement


async def test_stop_host_removes_only_drained_empty_hosts_and_loses_races_safely(api, clock) -> None:
    await setup_pool(api, "p1", hosts=3, max_sessions_per_gpu=2)
    await put_plan(api, "p1", plan_body())
    b = api.app[BROKER]
    fake = FakeProvider()
    fake.running = {"p1-h0": "p1", "p1-h1": "p1", "p1-h2": "p1"}
    scaler = Scaler(b, fake, b.settings)
    at(clock, 2025, 12, 2, 17, 0)
    await new_session(api, "u1")  # on p1-h0
    at(clock, 2025, 12, 2, 22, 0)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and {a.host for a in ev.applied if a.kind == "drain"} == {"p1-h1", "p1-h2"}
    clock.advance(60_000)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and sorted(fake.stopped) == ["p1-h1", "p1-h2"]
    assert await host_states(api) == {"p1-h0": ("up", 1)}
    # StopHost decisions the snapshot got wrong (races) stop nothing: an up host is left alone ...
    cfg = await b.get_pool("p1")
    a = await scaler.apply_decision(cfg, StopHost("p1-h0", "drained_empty"))
    assert a.outcome == Outcome.LOST_RACE and a.info["error"] == "host is not draining"
    assert "p1-h0" not in fake.stopped and (await host_states(api))["p1-h0"] == ("up", 1)
    # ... and so is a draining host that holds a session: Redis' atomic re-check refuses it
    await api.post("/api/v1/hosts/p1-h0/drain", headers=auth(ADMIN))
    a = await scaler.apply_decision(cfg, StopHost("p1-h0", "drained_empty"))
    assert a.outcome == Outcome.LOST_RACE and "live session" in a.info["error"]
    assert "p1-h0" not in fake.stopped and (await host_states(api))["p1-h0"] == ("draining", 1)


async def test_force_logoff_warns_then_ends_only_after_the_wait(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=4)
    await put_plan(api, "p1", plan_body(mode="force_logoff", wait_min=15))
    b = api.app[BROKER]
    scaler = api.app[SCALER]
    at(clock, 2025, 12, 2, 17, 0)
    tok, s1 = await new_session(api, "u1")  # p1-h0
    await new_session(api, "u2")  # p1-h1
    assert s1["host"] == "p1-h0"
    resp = await api.get(f"/api/v1/sessions/{s1['id']}/events", headers=auth(tok))
    node_q = b.live.redis.pubsub()
    await node_q.subscribe(b.live.keys.chan_node("p1-h0"))

    async def next_event() -> tuple[str, dict]:
        event = ""
        while True:
            line = (await asyncio.wait_for(resp.content.readline(), 5)).decode().strip()
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                return event, json.loads(line[6:])

    assert (await next_event())[0] == "state"
    at(clock, 2025, 12, 2, 18, 30)  # ramp-down with force-logoff: drain p1-h0 and warn its user at once
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None
    assert [(a.kind, a.host) for a in ev.applied if a.kind != "set_strategy"] == [
        ("drain", "p1-h0"), ("warn_sessions", "p1-h0")]
    event, warning = await next_event()
    assert event == "warning" and warning["code"] == "scale_in" and warning["ends_in_s"] == 900
    assert "15 minutes" in warning["detail"]
    msg = None
    while msg is None or msg["type"] != "message":
        msg = await node_q.get_message(timeout=5)
    assert json.loads(msg["data"])["cmd"] == "warn"
    await node_q.aclose()

    clock.advance(14 * 60_000 + 59_000)  # not yet: the announced wait is 15 minutes
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and not any(a.kind == "end_sessions" for a in ev.applied)
    assert (await b.live.get_session(s1["id"]))["state"] != "ended"
    clock.advance(1_000)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None
    [end] = [a for a in ev.applied if a.kind == "end_sessions"]
    assert (end.host, end.reason, end.count, end.info["sessions"]) == ("p1-h0", "force_logoff", 1, [s1["id"]])
    event, state = await next_event()
    assert (event, state["state"], state["end_reason"]) == ("state", "ended", "scale_in")
    resp.close()
    # the host is now drained and empty; a static inventory keeps it idle
    clock.advance(60_000)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ("stop_host", "p1-h0", "skipped") in kinds(ev)
    rows = (await (await api.get("/api/v1/pools/p1/autoscale?limit=3", headers=auth(ADMIN))).json())["decisions"]
    assert [(d["kind"], d["reason"]) for d in rows] == [("end_sessions", "force_logoff"),
                                                        ("warn_sessions", "force_logoff_warning"),
                                                        ("drain", "scale_in")]


async def test_an_admin_undrain_wins_over_a_pending_force_logoff(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=4)
    await put_plan(api, "p1", plan_body(mode="force_logoff", wait_min=1))
    b = api.app[BROKER]
    scaler = api.app[SCALER]
    at(clock, 2025, 12, 2, 17, 0)
    _tok, s1 = await new_session(api, "u1")  # p1-h0
    await new_session(api, "u2")  # p1-h1
    at(clock, 2025, 12, 2, 18, 30)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None and ("warn_sessions", "p1-h0", "applied") in kinds(ev)
    assert (await host_states(api))["p1-h0"][0] == "draining"
    assert (await api.post("/api/v1/hosts/p1-h0/undrain", headers=auth(ADMIN))).status == 200
    clock.advance(120_000)
    await scaler.evaluate_pool("p1")
    assert (await b.live.get_session(s1["id"]))["state"] != "ended"


async def test_deleting_the_plan_undrains_and_stops_autoscaling(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=2)
    await put_plan(api, "p1", plan_body(down_min=50))
    scaler = api.app[SCALER]
    at(clock, 2025, 12, 2, 22, 0)
    await scaler.evaluate_pool("p1")
    assert {s for s, _ in (await host_states(api)).values()} == {"up", "draining"}
    assert (await api.delete("/api/v1/pools/p1/plan", headers=auth(ADMIN))).status == 204
    assert {s for s, _ in (await host_states(api)).values()} == {"up"}
    assert await scaler.run_once() == [] and await scaler.evaluate_pool("p1") is None
    view = await (await api.get("/api/v1/pools/p1/autoscale", headers=auth(ADMIN))).json()
    assert not view["enabled"] and view["decisions"][0]["reason"] == "autoscale_disabled"


async def test_run_once_evaluates_every_pool_with_a_plan(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    await setup_pool(api, "p2", hosts=1)
    await put_plan(api, "p2", plan_body())
    at(clock, 2025, 12, 2, 12, 0)
    evs = await api.app[SCALER].run_once()
    assert [e.pool for e in evs] == ["p2"]


def test_build_snapshot_merges_redis_and_provider_views() -> None:
    cfg = PoolConfig("p", max_sessions_per_gpu=3)
    loads = [HostLoad("a", "up", (GpuLoad(0, 4, 0),)), HostLoad("b", "draining", (GpuLoad(0, 4, 0),)),
             HostLoad("c", "down", (GpuLoad(0, 4, 0),))]
    snap, starting, overdue = build_snapshot(
        cfg, loads, {"a": 0, "b": 1}, provider_hosts=["a", "c", "n1", "n2"], pending=1,
        starting={"n2": 0}, queued=2, max_hosts=5, now_ms=1_000_000, boot_timeout_ms=600_000)
    hosts = {h.host_id: (h.state, h.sessions, h.seats) for h in snap.hosts}
    # b's seat counter says 0 but its session set has one: not empty; c is down but the provider runs it
    assert hosts == {"a": ("up", 0, 4), "b": ("draining", 1, 4), "c": (HOST_STARTING, 0, 4),
                     "n1": (HOST_STARTING, 0, 4)}
    assert starting == {"c": 1_000_000, "n1": 1_000_000} and overdue == ["n2"]
    assert (snap.pending_starts, snap.queued, snap.max_hosts, snap.new_host_seats) == (1, 2, 5, 4)


# --- predictive plans ---------------------------------------------------------------------------


async def test_a_predictive_plan_is_validated_stored_and_named_in_its_errors(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    url = "/api/v1/pools/p1/plan"
    body = {**plan_body(), "mode": "predictive", "predictive": {"margin_pct": 15, "margin_seats": 1}}
    for bad, field in (({**body, "mode": "clairvoyant"}, "mode"),
                       ({**body, "predictive": {"margin_pct": -3}}, "predictive.margin_pct"),
                       ({**body, "predictive": {"boot_s": "slow"}}, "predictive.boot_s"),
                       ({**body, "predictive": {"history_weeks": 99}}, "predictive.history_weeks")):
        r = await api.put(url, json=bad, headers=auth(ADMIN))
        assert r.status == 422, await r.text()
        problem = await r.json()
        assert problem["field"] == field and problem["detail"].startswith(field)
    assert (await api.get(url, headers=auth(ADMIN))).status == 404  # nothing stored
    await put_plan(api, "p1", body)
    got = (await (await api.get(url, headers=auth(ADMIN))).json())["plan"]
    assert got["mode"] == "predictive"
    assert got["predictive"] == {"margin_pct": 15.0, "margin_seats": 1, "boot_s": 300, "history_weeks": 4}


async def test_predictive_evaluation_logs_forecast_margin_and_actual_with_each_decision(api, clock) -> None:
    await setup_pool(api, "p1", hosts=3, max_sessions_per_gpu=2)
    await put_plan(api, "p1", {**plan_body(), "mode": "predictive",
                               "predictive": {"margin_pct": 10, "margin_seats": 0}})
    b = api.app[BROKER]
    fake = FakeProvider()
    fake.running = {"p1-h0": "p1", "p1-h1": "p1", "p1-h2": "p1"}
    scaler = Scaler(b, fake, dataclasses.replace(b.settings, autoscale_interval_s=60.0))
    at(clock, 2025, 12, 2, 10, 0)  # peak: predictive plans scale in whenever the forecast allows
    await new_session(api, "u1")  # breadth-first for now: on p1-h0
    # no history yet (no forecast): the live demand, 1 session, sizes the pool: ceil(1 * 1.1) = 2 seats of 6;
    # the two empty hosts are drained and stopped in the same pass, the busy one is never touched
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None
    assert kinds(ev) == [("set_strategy", None, "applied"), ("drain", "p1-h1", "applied"),
                         ("stop_host", "p1-h1", "applied"), ("drain", "p1-h2", "applied"),
                         ("stop_host", "p1-h2", "applied")]
    assert [a.reason for a in ev.applied] == ["predictive_strategy", "forecast_surplus", "drained_empty",
                                              "forecast_surplus", "drained_empty"]
    assert sorted(fake.stopped) == ["p1-h1", "p1-h2"] and await host_states(api) == {"p1-h0": ("up", 1)}
    view = await (await api.get("/api/v1/pools/p1/autoscale", headers=auth(ADMIN))).json()
    drain = next(d for d in view["decisions"] if d["kind"] == "drain")
    assert drain["reason"] == "forecast_surplus"
    facts = drain["detail"]
    assert (facts["actual"], facts["capacity"], facts["target"], facts["margin_pct"], facts["trend"]) == (
        1, 6, 2, 10.0, 1.0)
    assert "forecast" not in facts and "no forecast" in facts["detail"] and facts["outcome"] == "applied"
    assert view["state"]["last_demand"] == 1.0 and view["state"]["forecast_ratio"] == 1.0
    # demand grows: 3 sessions on the 2 seats left (one waits); the live trend adds the growth over boot +
    # interval (60 s here): +2 per 60 s -> 3 + 2 / 60 * 360 = 15 -> ceil(16.5) = 17 seats: 8 hosts of 2
    await new_session(api, "u2")
    await new_session(api, "u3")
    clock.advance(60_000)
    ev = await scaler.evaluate_pool("p1")
    assert ev is not None
    [start] = [a for a in ev.applied if a.kind == "start_hosts"]
    assert (start.count, start.reason, start.info["target"], start.info["actual"]) == (8, "actual", 17, 3)
    assert scaler._forecasts["p1"][2] is None  # no week of history: no forecast, refitted within the hour


def test_history_forecast_uses_whole_weeks_since_the_first_request() -> None:
    start = datetime(2025, 11, 3, tzinfo=UTC)  # a Monday; the window is three weeks from here
    first_ms = int(start.timestamp() * 1000) + 7 * 86_400_000  # the pool is two weeks old
    rows = [(first_ms + k * 3_600_000, first_ms + k * 3_600_000, first_ms + k * 3_600_000 + 1_800_000)
            for k in range(14 * 24)]  # every hour a 30-minute session
    fc = history_forecast(rows, start, 3, "UTC")
    assert fc is not None and fc.weeks == 2 and fc.trend_per_week == pytest.approx(1.0)
    t = start.timestamp() + 21 * 86_400 + 10 * 3600  # Monday after the window, 10:00 .. 10:30 and 10:30 .. 11:00
    assert fc.at(t + 600) == pytest.approx(1.0) and fc.at(t + 2400) == pytest.approx(0.0)
    assert history_forecast([], start, 3, "UTC") is None
    assert history_forecast(rows[-48:], start, 3, "UTC") is None  # two days of history: under a week


def test_sizing_report_has_the_yardsticks_and_a_predictive_plan_runs_in_it() -> None:
    demand = synthetic_demand(60, 1, seed=4)
    config = SimConfig(PoolConfig("p", max_queue=10_000), hosts=30, seats_per_host=4, days=1)
    predictive = dataclasses.replace(DEFAULT_PLAN, mode="predictive")
    report = sizing_report(demand, config, predictive, "proposed", False, 1.0, None)
    oracle = report["yardsticks"]["oracle_host_hours"]
    assert report["yardsticks"]["lower_bound_host_hours"] <= oracle < report["host_hours"]["plan"]
    assert report["vs_oracle"]["plan"] == round(report["host_hours"]["plan"] / oracle, 4)
    assert report["vs_oracle"]["always_on"] > report["vs_oracle"]["plan"] > 1
    assert report["forecast"] is None and [r["label"] for r in report["results"]] == ["always-on", "proposed"]
