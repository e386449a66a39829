"""The render-node agent: registration, heartbeats, broker commands, session runtimes.

Talks to the broker only (REST + one WebSocket):
- ``POST /api/v1/hosts`` registers the host's GPUs (NVML or declared);
- ``PUT /api/v1/hosts/{id}/heartbeat`` every ``heartbeat_interval_s`` renews
  the lease and reports GPU telemetry, per-session stream stats and the node's own
  counts (freezes, encoder errors, session starts and start failures by reason:
  ``streamer.node.starts``; its viewers' glass-to-glass histogram: ``streamer.media.glass``); the reply
  lists sessions to start (assigned but not running here: reliable delivery
  even if a pub/sub command was missed) and to stop (ended by the broker);
- ``GET /api/v1/hosts/{id}/commands`` (WebSocket) pushes start/stop/warn and
  viewer signaling; answers and candidates go back up the same socket.
Session state goes back with ``PUT /api/v1/hosts/{id}/sessions/{sid}/state``:
``running`` when the runtime is ready and whenever a viewer connects,
``disconnected`` when the viewer goes away, ``ended`` when the app exits.
Credentials: the shared node token (``node_token``) only registers.  The registration reply
carries ``node_credential``, a token bound to this host id; every other call (heartbeat, command
socket, state reports, drain, deregistration) carries that credential, and a heartbeat reply
renews it before it expires or when the broker rotated its key.  A call refused with 401/403
(credential expired, its key removed, or a broker that wants a credential the node lacks) makes the
node register again: with its credential when it still holds one, else with the node token.  A
broker that predates credentials answers without one; the node then keeps the node token.
A host the broker forgot (404 with ``reregister``; e.g. its Redis came back empty) registers
again, listing the sessions it still streams (user, GPU, kind, profile, state) so the broker
re-adopts them; it stops those the reply lists in ``stop``.  A host an
admin or the autoscaler removed (410 ``host_retired``, on register or
heartbeat) stops: the agent ends its sessions and ``run()`` returns, so a
scaled-in node never comes back under its id before its provider stops it.

Concurrency: one asyncio loop; one task per concurrent job (heartbeat loop,
command socket loop, one start task per session, one task per viewer signaling
message).  The command loop never awaits a signaling message: an offer that
hangs (``OFFER_TIMEOUT_S`` bounds it) cannot hold up a later stop or another
session's offer.  A session's messages still apply in arrival order (each task
reaches the runtime's FIFO signal lock before the next one starts), and
stopping a session cancels its messages in flight first.  Every session
runtime is stopped on shutdown, so the node leaves no display or process behind.
Invariant: at most one runtime per session id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable
from typing import Any

import aiohttp

from broker.protocol import API_PREFIX, NodeCommand, SignalType
from rbcommon.procs import sweep_stale_tmpdirs
from rbcommon.udpports import PortRange
from streamer.desktop import sessionuser
from streamer.desktop.audio import AUDIO_TMP_PREFIX
from streamer.desktop.display import DISPLAY_TMP_PREFIX
from streamer.desktop.uinput import gamepad_capability, probe_uinput
from streamer.media.glass import merge_snapshots
from streamer.media.session import RuntimeConfig, SessionRefused, SessionRuntime, SessionSpec
from streamer.node.gpus import GpuInfo, GpuTelemetry
from streamer.node.health import NodeHealth
from streamer.node.inventory import take_inventory
from streamer.node.selftest import SelftestConfig, SelftestReport, SelftestRunner
from streamer.node.settings import NodeSettings
from streamer.node.starts import StartCounts, start_failure_reason
from streamer.node.watchdog import Limits

log = logging.getLogger(__name__)

DRAIN_REASON_MAX = 200  # the broker refuses longer drain reasons (broker/http/api.py DRAIN_REASON_MAX)

RETRY_MAX_S = 5.0  # backoff cap for broker reconnects
# A staged session (started for the next user of the pool) waits this long before it starts, unless
# a user is handed it meanwhile: the refill the broker asks for when it hands one out would otherwise
# start its display, app and encoder while that user's viewer connects, on the same CPUs.
STAGED_START_DELAY_S = 1.0
# An offer the runtime has not answered in this long is abandoned (logged): its peer is closed and the
# session's later messages go on.  The clients send their offer again after 10 s without an answer.
OFFER_TIMEOUT_S = 20.0


def seat_gpu(raw: object) -> int | None:
    """The GPU index of a start command's seat (the broker sends it as a string or int; '' = none)."""
    if raw is None or raw == "":
        return None
    return int(str(raw))


class Retired(Exception):
    """The broker retired this host id (HTTP 410): stop, never register again under it."""


def node_version(settings: NodeSettings) -> str:
    """The version string this node registers with: ``NODE_VERSION`` when set, else the package version.

    The broker keeps it per host and a pool's canary rollout routes by it (``broker.rollout``)."""
    if settings.version:
        return settings.version[:64]
    try:
        return importlib.metadata.version("render-broker")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def _refused(status: int) -> bool:
    """401 (credential expired or forged) or 403 (not this host's credential): register again."""
    return status in (401, 403)


class NodeAgent:
    def __init__(self, settings: NodeSettings) -> None:
        self.s = settings
        self.host_id = settings.resolved_host_id()
        self.sessions: dict[str, SessionRuntime] = {}
        # what the broker said of each running session (user, GPU, kind, profile) and when it started:
        # a re-registration lists them, so a broker whose Redis lost its state re-adopts them
        self._claims: dict[str, dict[str, Any]] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        # staged sessions (started for the next user of the pool) handed to a user while still starting:
        # the start command that names the user, applied once the runtime is up
        self._binding: dict[str, dict[str, Any]] = {}
        self._bound: dict[str, asyncio.Event] = {}  # set when a staged session waiting to start is handed out
        self._signals: dict[str, set[asyncio.Task[None]]] = {}  # viewer signaling messages in flight, by session
        self.gpus: list[GpuInfo] = []
        self._http: aiohttp.ClientSession | None = None
        self._stop = asyncio.Event()
        self.registered = asyncio.Event()
        self.retired = False  # set when the broker refused this host id for good
        # raises ValueError naming the setting for an unknown account (the CLI prints it as one line)
        self.session_user = (sessionuser.lookup(settings.session_user) if settings.session_user
                             else sessionuser.node_user())
        # virtual gamepads for desktop sessions need /dev/uinput: probed once, the reason logged once in run()
        self.gamepad_missing = probe_uinput()
        self.runtime_config = RuntimeConfig(
            advertise_addresses=tuple(settings.advertise_addresses),
            encoder_preference=settings.encoder,
            capture_backend=settings.capture,
            game_renderer=settings.game_renderer,
            audio=settings.audio,
            game_beacon_ms=settings.game_beacon_ms,
            session_user=self.session_user,
            udp_ports=PortRange.parse(settings.udp_ports),
            app_refusal=sessionuser.refusal(self.session_user, os.geteuid(), settings.allow_root_sessions),
            resize_max_pixels=settings.resize_max_pixels,
            resize_max_side=settings.resize_max_side,
            clipboard_primary=settings.clipboard_primary,
            gamepad=self.gamepad_missing is None,
        )
        self._commands: aiohttp.ClientWebSocketResponse | None = None  # the open command socket, if any
        self._telemetry = GpuTelemetry()
        self.health = NodeHealth(Limits(max_temp_c=settings.watchdog_max_temp_c,
                                        max_loop_lag_ms=settings.watchdog_max_loop_lag_ms,
                                        healthy_hold_ms=int(settings.watchdog_healthy_hold_s * 1000)),
                                 enabled=settings.watchdog)
        self.health.capabilities["gamepad"] = gamepad_capability(self.gamepad_missing)
        self._shutting_down = False
        # the stream self-test, on idle capacity only: no session live or starting
        self.selftest = SelftestRunner(
            SelftestConfig(encoder_preference=settings.encoder,
                           advertise_addresses=tuple(settings.advertise_addresses) or ("127.0.0.1",),
                           source=settings.selftest_source, capture_backend=settings.capture),
            settings.selftest_interval_s,
            idle=lambda: not self.sessions and not self._starting and not self._shutting_down,
            on_result=self._selftest_result)
        self._session_gone = asyncio.Event()  # set whenever a session leaves this node
        self.credential: str | None = None  # host-bound node credential from the broker; None = node token
        # freezes and encoder errors of the sessions that left this node, and its self-tests' encoder errors
        # (the heartbeat's *_total add the live sessions' counts: node-cumulative counters, reset only by a
        # node restart)
        self._ended_counts = {"freezes": 0, "encoder_errors": 0}
        # the same for the viewers' glass-to-glass histogram (streamer.media.glass), and starts / start
        # failures by reason (streamer.node.starts): node-cumulative, in every heartbeat
        self._ended_glass: dict[str, Any] | None = None
        self.starts = StartCounts()

    # ---- plumbing ------------------------------------------------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None
        return self._http

    def _url(self, path: str) -> str:
        return self.s.broker_url.rstrip("/") + API_PREFIX + path

    def _auth(self) -> dict[str, str]:
        """Headers for a per-host call: this host's credential, or the node token until there is one."""
        return {"Authorization": f"Bearer {self.credential or self.s.node_token}"}

    def _take_credential(self, data: Any) -> None:
        """Keep the ``node_credential`` a registration or heartbeat reply carries (if it is for this host)."""
        cred = data.get("node_credential") if isinstance(data, dict) else None
        if isinstance(cred, dict) and isinstance(cred.get("token"), str) and cred.get("host") == self.host_id:
            self.credential = cred["token"]

    def _credential_refused(self, what: str, status: int) -> None:
        """A per-host call was refused for its credential: forget it if it is dead, and register again."""
        log.warning("host %s: %s refused with %s: registering again", self.host_id, what, status)
        if status == 401:
            self.credential = None
        self.registered.clear()

    async def run(self) -> None:
        """Run until ``stop()``: register, then heartbeat and follow commands."""
        tls = ssl.create_default_context(cafile=self.s.broker_ca) if self.s.broker_ca else None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15),
                                         connector=aiohttp.TCPConnector(ssl=tls) if tls else None) as http:
            self._http = http
            stale = await asyncio.to_thread(sweep_stale_tmpdirs, (DISPLAY_TMP_PREFIX, AUDIO_TMP_PREFIX))
            if stale:  # sessions of a node that was killed before it could clean up
                log.info("removed %d stale session folder(s): %s", len(stale), ", ".join(p.name for p in stale[:5]))
            inventory = await asyncio.to_thread(take_inventory, self.s.seats)
            self.gpus = inventory.gpus
            self.runtime_config = dataclasses.replace(self.runtime_config, gpu_render=inventory.gpu_render)
            if inventory.gpu_render and self.gpus:  # test the encoder sessions on the first GPU use
                self.selftest.config = dataclasses.replace(self.selftest.config, gpu=self.gpus[0].index)
            log.info("inventory: %s; %s", inventory.reason, inventory.seats_note)
            if self.gamepad_missing is not None:
                log.info("desktop sessions get no gamepads (their pad input is dropped): %s", self.gamepad_missing)
            tasks = [
                asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
                asyncio.create_task(self._command_loop(), name="commands"),
                asyncio.create_task(self.health.run_lag_monitor(), name="loop-lag"),
            ]
            if self.s.selftest_interval_s > 0:
                tasks.append(asyncio.create_task(self.selftest.run_forever(), name="selftest"))
            runner = await self.health.serve(self.s.health_host, self.s.health_port) if self.s.health_port else None
            try:
                await self._stop.wait()
            finally:
                if runner is not None:
                    await runner.cleanup()
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
                await self.stop_all("host retired by the broker" if self.retired else "node shutting down")
                if not self.retired:  # a retired host is already deregistered
                    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                        await http.delete(self._url(f"/hosts/{self.host_id}"), params={"force": "true"},
                                          headers=self._auth())
            self._http = None

    def stop(self) -> None:
        self._stop.set()

    def request_shutdown(self) -> None:
        """SIGTERM (a rolling restart): shut down gracefully; a second request stops at once."""
        if self._shutting_down:
            self.stop()
            return
        self._shutting_down = True
        asyncio.get_running_loop().create_task(self.shutdown(self.s.shutdown_grace_s), name="shutdown")

    async def shutdown(self, grace_s: float) -> None:
        """Drain this host, warn every viewer with a countdown, wait up to ``grace_s`` for the sessions
        to end (users leave, or the broker ends them), then stop.  With no session, stop at once."""
        if grace_s > 0 and (self.sessions or self._starting):
            await self.set_drained(True, f"node shutting down (SIGTERM), grace {grace_s:g} s")
            ends_in = int(grace_s)
            for rt in list(self.sessions.values()):
                with contextlib.suppress(Exception):
                    await rt.warn("node_restart", f"This machine restarts for maintenance in {ends_in} s: "
                                                  "save your work.", ends_in)
            deadline = asyncio.get_running_loop().time() + grace_s
            while self.sessions or self._starting:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    log.info("shutdown grace of %g s over with %d session(s) left", grace_s, len(self.sessions))
                    break
                self._session_gone.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._session_gone.wait(), left)
        self.stop()

    async def _watch(self, gpus: list[dict[str, Any]], encoder_errors: int = 0) -> None:
        """One watchdog step on this heartbeat's figures; a drain/undrain goes to the broker with its reason."""
        decision = self.health.step(gpus, len(self.sessions), int(time.time() * 1000), encoder_errors)
        if decision.action in ("drain", "undrain") and not self._shutting_down:
            await self.set_drained(decision.action == "drain", f"watchdog: {decision.reason}")

    async def read_gpus(self) -> list[dict[str, Any]]:
        """This heartbeat's GPU telemetry: NVML's where sessions render on the GPUs, else the indexes alone.

        The watchdog and the broker read these rows; a drill replaces this method to inject readings.
        """
        if self.runtime_config.gpu_render:
            return await asyncio.to_thread(self._telemetry.read, [g.index for g in self.gpus])
        return [{"index": g.index} for g in self.gpus]

    def _selftest_result(self, report: SelftestReport | None, why: str) -> None:
        """The latest self-test's outcome reaches the watchdog (a failure drains at the next heartbeat)."""
        self.health.selftest_failure = why
        self.health.selftest = report.to_dict() if report is not None else {"ok": False, "reason": why}
        if report is not None:  # the host's encoder failed: the node's encoder-error counter says so too
            self._ended_counts["encoder_errors"] += report.encoder_errors

    async def set_drained(self, drained: bool, reason: str) -> bool:
        """Ask the broker to drain (no new sessions) or undrain this host; False when it did not answer yes.

        A reason over the broker's limit (several watchdog problems at once) is cut to it, so the drain
        still happens (the whole reason is in the node's log).
        """
        if len(reason) > DRAIN_REASON_MAX:
            reason = reason[: DRAIN_REASON_MAX - 3] + "..."
        path = f"/hosts/{self.host_id}/{'drain' if drained else 'undrain'}"
        try:
            async with self.http.post(self._url(path), json={"reason": reason}, headers=self._auth()) as r:
                if _refused(r.status):
                    self._credential_refused(path, r.status)
                if r.status == 200:
                    log.info("host %s: %s (%s)", self.host_id, "drained" if drained else "undrained", reason)
                    return True
                log.warning("host %s: %s refused: %s %s", self.host_id, path, r.status, await r.text())
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("host %s: %s failed: %s", self.host_id, path, exc)
        return False

    async def stop_all(self, why: str) -> None:
        for t in list(self._starting.values()):
            t.cancel()
        for sid in list(self._signals):
            await self._cancel_signals(sid)
        for sid in list(self.sessions):
            await self._stop_session(sid, why, report=False)

    # ---- registration and heartbeats ---------------------------------------------------------
    async def register(self) -> None:
        body = {
            "id": self.host_id,
            "pool": self.s.pool,
            "address": self.s.address or self.host_id,
            "gpus": [g.to_wire() for g in self.gpus],
            "version": node_version(self.s),
            "sessions": self._session_claims(),
        }
        if self.credential is not None:  # re-registering: prove it is this host with its own credential
            async with self.http.post(self._url("/hosts"), json=body, headers=self._auth()) as r:
                if r.status == 410:
                    raise Retired(await r.text())
                if r.status == 201:
                    data = await r.json()
                    self._take_credential(data)
                    await self._stop_refused(data)
                    self._registered_now()
                    return
                if not _refused(r.status):
                    raise RuntimeError(f"register failed: {r.status} {await r.text()}")
                log.warning("host %s: credential refused on register (%s); using the node token", self.host_id,
                            r.status)
                self.credential = None
        async with self.http.post(self._url("/hosts"), json=body,
                                  headers={"Authorization": f"Bearer {self.s.node_token}"}) as r:
            if r.status == 410:
                raise Retired(await r.text())
            if r.status != 201:
                raise RuntimeError(f"register failed: {r.status} {await r.text()}")
            data = await r.json()
            self._take_credential(data)
        await self._stop_refused(data)
        self._registered_now()

    def _session_claims(self) -> list[dict[str, Any]]:
        """The running sessions as a registration lists them (id, user, state, GPU, kind, profile, start)."""
        out = []
        for sid, rt in self.sessions.items():
            claim = self._claims.get(sid)
            if claim is None:
                continue
            state = "running" if rt.stats().get("connected") else "disconnected"
            out.append({"id": sid, "state": state, **claim})
        return out

    async def _stop_refused(self, reply: dict[str, Any]) -> None:
        """Stop the sessions a registration reply lists in ``stop`` (ended, elsewhere, or refused)."""
        for sid in reply.get("stop") or []:
            await self._stop_session(str(sid), "not re-adopted by the broker", report=False)
        if reply.get("adopted"):
            log.warning("broker re-adopted %d running session(s) on re-registration", len(reply["adopted"]))

    def _registered_now(self) -> None:
        self.registered.set()
        self.health.registered = True
        log.info("registered host %s in pool %s (%d GPU/seat group(s))", self.host_id, self.s.pool, len(self.gpus))

    async def _heartbeat_loop(self) -> None:
        backoff = 0.2
        while True:
            try:
                if not self.registered.is_set():
                    await self.register()
                await self.heartbeat()
                self.health.beat(True)
                backoff = 0.2
                await asyncio.sleep(self.s.heartbeat_interval_s)
            except asyncio.CancelledError:
                raise
            except Retired as exc:
                log.warning("broker retired host %s; stopping: %s", self.host_id, exc)
                self.retired = True
                self.stop()
                return
            except Exception as exc:  # task boundary: broker away or refusing; retry with backoff
                self.health.beat(False)
                log.warning("heartbeat/register failed: %s (retry in %.1f s)", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)

    async def heartbeat(self) -> None:
        sessions: list[dict[str, Any]] = []
        glass = [self._ended_glass]
        for sid, rt in self.sessions.items():
            st = rt.stats()
            glass.append(st.get("glass_to_glass_ms"))
            entry = {
                "id": sid,
                "state": "running" if st.get("connected") else "disconnected",
                "last_input_ms": rt.last_input_ms,
            }
            for k in (
                "fps",
                "target_fps",
                "encode_ms",
                "bitrate_bps",
                "target_bps",
                "rtt_ms",
                "jitter_ms",
                "loss",
                "keyframes",
                "encoder",
                "width",
                "height",
                "candidate",
                "freezes",
                "encoder_errors",
                "first_frame_ms",
            ):
                if st.get(k) is not None:
                    entry[k] = st[k]
            sessions.append(entry)
        gpus = await self.read_gpus()
        body: dict[str, Any] = {"gpus": gpus, "sessions": sessions}
        for k, ended in self._ended_counts.items():  # the node's counters: sessions gone + live ones
            body[f"{k}_total"] = ended + sum(int(e.get(k) or 0) for e in sessions)
        body.update(self.starts.heartbeat_fields())
        if (histogram := merge_snapshots(glass)) is not None:
            body["glass_to_glass_ms"] = histogram
        await self._watch(gpus, int(body["encoder_errors_total"]))
        if (watchdog := self.health.heartbeat_report()) is not None:
            body["watchdog"] = watchdog
        async with self.http.put(self._url(f"/hosts/{self.host_id}/heartbeat"), json=body,
                                 headers=self._auth()) as r:
            data = await r.json()
            if _refused(r.status):
                self._credential_refused("heartbeat", r.status)
                raise RuntimeError(f"heartbeat refused: {r.status} {data}")
            if r.status == 410 and data.get("retired"):
                raise Retired(str(data.get("detail", "host retired")))
            if r.status == 404 and data.get("reregister"):
                self.registered.clear()
                raise RuntimeError("broker forgot this host; registering again")
            if r.status != 200:
                raise RuntimeError(f"heartbeat refused: {r.status} {data}")
        self._take_credential(data)
        if not self._shutting_down:  # (a node shutting down asks for no drain: nothing to compare)
            self.health.host_state(data.get("host_state"))
        for cmd in data.get("start", []):
            self._start_session(cmd["session"])
        for sid in data.get("stop", []):
            await self._stop_session(sid, "ended by broker", report=False)

    # ---- commands --------------------------------------------------------------------------
    async def _command_loop(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self.registered.wait()
                ws_url = self._url(f"/hosts/{self.host_id}/commands").replace("http", "ws", 1)
                async with self.http.ws_connect(
                    ws_url, heartbeat=10.0, timeout=aiohttp.ClientWSTimeout(ws_close=5), headers=self._auth()
                ) as ws:
                    backoff = 0.2
                    log.info("command socket open")
                    self._commands = ws
                    try:
                        async for msg in ws:
                            if msg.type == aiohttp.WSMsgType.TEXT:
                                await self._on_command(ws, json.loads(msg.data))
                    finally:
                        self._commands = None
            except asyncio.CancelledError:
                raise
            except aiohttp.WSServerHandshakeError as exc:
                if _refused(exc.status):
                    self._credential_refused("command socket", exc.status)
                else:
                    log.warning("command socket refused: %s (retry in %.1f s)", exc, backoff)
            except Exception as exc:  # task boundary: reconnect with backoff
                log.warning("command socket failed: %s (retry in %.1f s)", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MAX_S)

    async def _on_command(self, ws: aiohttp.ClientWebSocketResponse, cmd: dict[str, Any]) -> None:
        kind = cmd.get("cmd")
        if kind in (NodeCommand.START, NodeCommand.STOP, NodeCommand.WARN, NodeCommand.CONTROL):  # not signal: many
            sid = cmd["session"]["id"] if kind == NodeCommand.START else cmd.get("session_id")
            log.info("command socket: %s %s%s", kind, sid, " (bind)" if cmd.get("bind") else "")
        if kind == NodeCommand.START:
            self._start_session(cmd["session"])
        elif kind == NodeCommand.STOP:
            await self._stop_session(cmd["session_id"], cmd.get("reason", "stopped"), report=False)
        elif kind == NodeCommand.WARN:
            rt = self.sessions.get(cmd["session_id"])
            if rt:
                await rt.warn(cmd.get("code", "warning"), cmd.get("detail", ""), int(cmd.get("ends_in_s", 0)))
        elif kind == NodeCommand.CONTROL:
            rt = self.sessions.get(cmd.get("session_id", ""))
            viewer = cmd.get("viewer")
            if rt:
                rt.set_controller(viewer if isinstance(viewer, str) and viewer else None)
        elif kind == NodeCommand.SIGNAL:
            sid = str(cmd["session_id"])
            viewer = cmd.get("viewer")
            viewer = viewer if isinstance(viewer, str) and viewer else None  # a share link's viewer (view-only)
            task = asyncio.create_task(self._on_signal(ws, sid, cmd["msg"], viewer, str(cmd.get("role", "view"))),
                                       name=f"signal-{sid}")
            tasks = self._signals.setdefault(sid, set())
            tasks.add(task)
            task.add_done_callback(lambda t: self._signal_done(sid, t))
        elif kind == "error":
            log.warning("broker says: %s", cmd.get("detail"))

    async def _on_signal(self, ws: aiohttp.ClientWebSocketResponse, sid: str, msg: Any, viewer: str | None = None,
                         role: str = "view") -> None:
        """Apply one signaling message (the owner's, or ``viewer``'s: a share link's) and send the runtime's
        replies (a task of its own)."""
        task = self._starting.get(sid)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)  # an offer can arrive while the runtime is still starting
        rt = self.sessions.get(sid)
        if rt is None:
            return
        def handle() -> Awaitable[list[dict[str, Any]]]:
            return rt.handle_viewer_signal(viewer, role, msg) if viewer else rt.handle_signal(msg)

        offer = isinstance(msg, dict) and msg.get("type") == SignalType.OFFER
        if not offer:
            replies = await handle()
        else:
            log.info("session %s: offer received%s", sid, f" from viewer {viewer}" if viewer else "")
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(OFFER_TIMEOUT_S):
                    replies = await handle()
            except TimeoutError:
                log.warning("session %s: offer not answered in %g s: abandoned (the viewer offers again)", sid,
                            OFFER_TIMEOUT_S)
                return
            first = replies[0] if replies else {}
            log.info("session %s: offer answered in %.0f ms (%s)", sid, (time.monotonic() - t0) * 1000,
                     first.get("code") or first.get("type") or "no reply")
        for reply in replies:
            await ws.send_json({"cmd": NodeCommand.SIGNAL.value, "session_id": sid, "msg": reply,
                                **({"viewer": viewer} if viewer else {})})

    def _signal_done(self, sid: str, task: asyncio.Task[None]) -> None:
        tasks = self._signals.get(sid)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._signals[sid]
        if not task.cancelled() and task.exception() is not None:  # task boundary: the socket goes on
            log.warning("session %s: signaling message failed: %r", sid, task.exception())

    async def _cancel_signals(self, sid: str) -> None:
        """Cancel a session's signaling messages in flight and wait for them (they release its signal lock)."""
        tasks = self._signals.pop(sid, set()) - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # ---- sessions --------------------------------------------------------------------------
    def _start_session(self, s: dict[str, Any]) -> None:
        sid = s["id"]
        if sid in self.sessions or sid in self._starting:
            if s.get("user"):
                self._bind(s)
            return
        self._starting[sid] = asyncio.create_task(self._run_start(s), name=f"start-{sid}")

    def _spec(self, s: dict[str, Any]) -> SessionSpec:
        """The session spec of a start command; ValueError/TypeError when the command is malformed."""
        profile = s.get("profile") or {}
        return SessionSpec(
            id=s["id"],
            kind=s.get("kind") or "desktop",
            width=int(profile.get("width", 1280)),
            height=int(profile.get("height", 720)),
            fps=int(profile.get("fps", 30)),
            codec=profile.get("codec", "auto"),
            ice_servers=tuple(s.get("ice_servers") or ()),
            app_command=tuple(self.s.app_command),
            game_command=tuple(self.s.game_command),
            gpu=seat_gpu(s.get("gpu")),
        )

    def _bind(self, s: dict[str, Any]) -> None:
        """A staged session this node runs (or is starting) was handed to a user: it becomes theirs.

        Same session id, same runtime: display, app and encoder keep running; only what a
        re-registration claims (the user) changes.  A session still starting takes it once it is up.
        """
        sid = s["id"]
        if sid not in self.sessions:
            self._binding[sid] = s
            if sid in self._bound:
                self._bound[sid].set()  # its user waits: start it now
            return
        gpu = seat_gpu(s.get("gpu"))
        if sid not in self._claims and gpu is not None:
            self._claims[sid] = {"user": s["user"], "gpu": gpu, "kind": s.get("kind"),
                                 "profile": s.get("profile") or None, "started_ms": int(time.time() * 1000)}
            log.info("staged session %s handed to a user", sid)

    async def _run_start(self, s: dict[str, Any]) -> None:
        sid = s["id"]
        rt: SessionRuntime | None = None
        t0 = time.monotonic()
        try:
            if s.get("staged"):
                bound = self._bound.setdefault(sid, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(bound.wait(), STAGED_START_DELAY_S)
                self._bound.pop(sid, None)
                t0 = time.monotonic()
            self.starts.started()
            spec = self._spec(s)  # a malformed command fails this session's start, reported like any other
            rt = SessionRuntime(spec, self.runtime_config,
                                on_event=lambda ev, info: self._on_runtime_event(sid, ev, info))
            await rt.start()
        except Exception as exc:  # task boundary: the session fails, the node lives on
            reason = start_failure_reason(exc)
            self.starts.failed(reason)
            if isinstance(exc, SessionRefused):
                log.error("session %s refused: %s", sid, exc)  # an operator's setting, not a crash
            else:
                log.exception("session %s failed to start (%s)", sid, reason.value)
            await self._report(sid, "ended", "start_failed")
            self.health.session_failures += 1
            del self._starting[sid]
            self._binding.pop(sid, None)
            self._session_gone.set()
            if rt is not None:
                with contextlib.suppress(Exception):
                    await rt.stop(f"start failed: {exc}")
            return
        self.sessions[sid] = rt
        del self._starting[sid]
        s = self._binding.pop(sid, s)  # a staged session handed to a user while it started
        gpu = seat_gpu(s.get("gpu"))
        if gpu is not None and s.get("user"):
            self._claims[sid] = {"user": s["user"], "gpu": gpu, "kind": s.get("kind"),
                                 "profile": s.get("profile") or None, "started_ms": int(time.time() * 1000)}
        log.info(
            "%s %s ready in %.0f ms (%s %dx%d@%d)",
            "staged session" if s.get("staged") else "session",
            sid,
            (time.monotonic() - t0) * 1000,
            spec.kind,
            spec.width,
            spec.height,
            spec.fps,
        )
        await self._report(sid, "running")

    async def _on_runtime_event(self, sid: str, event: str, info: dict[str, Any]) -> None:
        if event == "connected":
            await self._report(sid, "running")
        elif event == "disconnected":
            await self._report(sid, "disconnected")
        elif event == "signal":  # a message for the viewer that answers nothing it sent (ice_failed, dtls_failed)
            if info.get("start_failure"):  # the session's first viewer connection failed: its start did
                self.starts.connection_failed(info["start_failure"])
            ws = self._commands
            if ws is None or ws.closed:
                log.info("session %s: no command socket, signaling message not sent: %s", sid, info.get("msg"))
                return
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
                await ws.send_json({"cmd": NodeCommand.SIGNAL.value, "session_id": sid, "msg": info["msg"]})
        elif event == "ended":
            if info.get("reason") == "capture_failed":  # the frame pipeline (capture or encoder) gave up
                self.health.session_failures += 1
            await self._stop_session(sid, info.get("reason", "app exited"), report=True)

    async def _stop_session(self, sid: str, why: str, *, report: bool) -> None:
        await self._cancel_signals(sid)  # an offer in progress holds the runtime's signal lock, which stop needs
        rt = self.sessions.pop(sid, None)
        self._claims.pop(sid, None)
        self._binding.pop(sid, None)
        self._bound.pop(sid, None)
        task = self._starting.pop(sid, None)
        if task is not None:
            task.cancel()
        if rt is not None:
            st = rt.stats()
            for k in self._ended_counts:
                self._ended_counts[k] += int(st.get(k) or 0)
            self._ended_glass = merge_snapshots([self._ended_glass, st.get("glass_to_glass_ms")])
            await rt.stop(why)
            log.info("session %s stopped: %s", sid, why)
        self._session_gone.set()
        if report:
            await self._report(sid, "ended", "node_ended")

    async def _report(self, sid: str, state: str, reason: str = "node_ended") -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self.http.put(
                self._url(f"/hosts/{self.host_id}/sessions/{sid}/state"), json={"state": state, "reason": reason},
                headers=self._auth(),
            ) as r:
                if _refused(r.status):
                    self._credential_refused(f"state report of {sid}", r.status)
                elif r.status >= 400:
                    log.info("state %s for %s not accepted: %s", state, sid, await r.text())
