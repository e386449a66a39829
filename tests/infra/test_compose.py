"""infra/compose.yaml is wired right: brokers x2, Redis master/replica + Sentinel, PostgreSQL, coturn, a node.

Read as YAML (anchors and merge keys resolved, ``${VAR:-default}`` taken at its default) and
checked against the settings the processes load; nothing is started (no Docker engine here).
The real Compose CLI (Debian's ``docker-compose`` 1.29, or the ``docker compose`` plugin) resolves
the file too, and the tests that need it skip with the reason where neither is installed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from broker.settings import BrokerSettings
from rbcommon.settings import load as load_settings
from streamer.node.settings import load as load_node_settings
from tests.infra.coturn import coturn_accepts, needs_turnserver

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "infra" / "compose.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def defaults(text: str) -> str:
    """Compose interpolation with an empty environment: ${VAR:-default} -> default."""
    out = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)
    assert "${" not in out, "a variable without a default"
    return out


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = yaml.safe_load(defaults(COMPOSE.read_text()))
    return dict(doc["services"])


def env(svc: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (svc.get("environment") or {}).items()}


def sentinel_conf(svc: dict[str, Any]) -> str:
    return " ".join(svc["command"])


def test_the_expected_services_and_images(services: dict[str, Any]) -> None:
    assert set(services) == {"redis-master", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3", "postgres",
                             "coturn", "broker-1", "broker-2", "node", "node-gpu"}
    for name in ("broker-1", "broker-2"):
        assert services[name]["image"] == f"render-broker:{VERSION}"
        assert services[name]["build"] == {"context": "..", "dockerfile": "infra/docker/broker.Dockerfile"}
    for name in ("node", "node-gpu"):
        assert services[name]["image"] == f"render-node:{VERSION}"
        assert services[name]["build"]["dockerfile"] == "infra/docker/render-node.Dockerfile"
        assert (COMPOSE.parent / services[name]["build"]["context"] / services[name]["build"]["dockerfile"]).is_file()
    assert services["node-gpu"]["profiles"] == ["gpu"] and "profiles" not in services["node"]
    assert {p.split(":")[0] for s in ("broker-1", "broker-2") for p in services[s]["ports"]} == {"8080", "8081"}


def test_depends_on_names_real_services_and_waits_only_on_health_it_can_see(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        items = deps.items() if isinstance(deps, dict) else ((d, {"condition": "service_started"}) for d in deps)
        for dep, cond in items:
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                # a healthcheck in compose, or our images' HEALTHCHECK (tests/infra/test_images.py)
                assert "healthcheck" in services[dep] or services[dep]["image"].startswith("render-broker:"), dep
    for b in ("broker-1", "broker-2"):
        assert {"postgres", "sentinel-1", "sentinel-2", "sentinel-3"} <= set(services[b]["depends_on"])
    assert services["redis-replica"]["depends_on"] == ["redis-master"]


def test_brokers_reach_redis_through_the_sentinels_and_postgres(services: dict[str, Any]) -> None:
    pg = env(services["postgres"])
    sentinels = [n for n in services if n.startswith("sentinel-")]
    for b in ("broker-1", "broker-2"):
        s, _ = load_settings(BrokerSettings, [], env(services[b]), "BROKER_")
        assert sorted(s.redis_sentinels) == sorted(f"{n}:26379" for n in sentinels)
        db = urlsplit(s.database_url)
        assert (db.hostname, db.port, db.username, db.password, db.path) == (
            "postgres", 5432, pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], "/" + pg["POSTGRES_DB"])
        assert s.host == "0.0.0.0" and s.port == 8080
        assert services[b]["ports"][0].endswith(f":{s.port}")
        for n in sentinels:
            conf = sentinel_conf(services[n])
            m = re.search(r"sentinel monitor (\S+) (\S+) (\d+) (\d+)", conf)
            assert m and m.group(1) == s.redis_sentinel_master and m.group(2) == "redis-master"
            assert m.group(2) in services and int(m.group(3)) == 6379 and 1 < int(m.group(4)) <= len(sentinels)
            assert "port 26379" in conf
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:][:2] == ["redis-master", "6379"]


def test_turn_secret_and_port_are_shared_by_broker_and_coturn(services: dict[str, Any]) -> None:
    s, _ = load_settings(BrokerSettings, [], env(services["broker-1"]), "BROKER_")
    cmd = services["coturn"]["command"]
    assert "--use-auth-secret" in cmd and f"--static-auth-secret={s.turn_secret}" in cmd
    port = next(a.split("=")[1] for a in cmd if a.startswith("--listening-port="))
    assert s.turn_urls == [f"turn:127.0.0.1:{port}?transport=udp", f"turn:127.0.0.1:{port}?transport=tcp"]
    assert {f"{port}:{port}/udp", f"{port}:{port}/tcp"} <= set(services["coturn"]["ports"])
    lo, hi = (next(a.split("=")[1] for a in cmd if a.startswith(f"--{k}-port=")) for k in ("min", "max"))
    assert f"{lo}-{hi}:{lo}-{hi}/udp" in services["coturn"]["ports"]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="the system redis-server is not installed")
def test_the_sentinel_command_monitors_the_master_under_the_brokers_name(services: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    """Run the compose sentinel's own shell command (addresses moved to loopback ports) on a real master."""
    from broker.embedded import free_port

    m, s_port = free_port(), free_port()
    cmd = services["sentinel-1"]["command"]
    assert cmd[:2] == ["sh", "-c"]
    script = (cmd[2].replace("redis-master 6379", f"127.0.0.1 {m}")
              .replace("'port 26379'", f"'port {s_port}' 'bind 127.0.0.1' 'dir {tmp_path}'")
              .replace("/tmp/sentinel.conf", str(tmp_path / "sentinel.conf"))
              .replace("exec redis-sentinel " + str(tmp_path / "sentinel.conf"),
                       f"exec redis-server {tmp_path / 'sentinel.conf'} --sentinel"))
    broker_s, _ = load_settings(BrokerSettings, [], env(services["broker-1"]), "BROKER_")
    procs = [subprocess.Popen(["redis-server", "--port", str(m), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL),
             subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.RedisError):
                addr = redis.Redis(port=s_port, socket_timeout=1).execute_command(
                    "SENTINEL", "get-master-addr-by-name", broker_s.redis_sentinel_master)
                if addr:
                    break
            assert all(p.poll() is None for p in procs), "redis or the sentinel exited"
            assert time.monotonic() < deadline, "the sentinel never answered"
            time.sleep(0.1)
        assert [a.decode() for a in addr] == ["127.0.0.1", str(m)]
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


@needs_turnserver
async def test_coturn_accepts_the_compose_arguments(services: dict[str, Any], unused_tcp_port_factory) -> None:
    await coturn_accepts(services["coturn"]["command"], unused_tcp_port_factory())


@pytest.mark.parametrize("name", ["node", "node-gpu"])
def test_the_node_registers_with_a_broker_and_outlives_its_drain(services: dict[str, Any], name: str) -> None:
    svc = services[name]
    ns = load_node_settings([], env(svc))
    broker_s, _ = load_settings(BrokerSettings, [], env(services["broker-1"]), "BROKER_")
    url = urlsplit(ns.broker_url)
    assert url.hostname in services and url.hostname.startswith("broker-") and url.port == broker_s.port
    assert ns.node_token == broker_s.node_token and ns.host_id and ns.health_port == 8090
    grace = int(svc["stop_grace_period"].removesuffix("s"))
    assert grace > ns.shutdown_grace_s  # docker stop waits past the node's drain grace before SIGKILL
    assert "broker-1" in svc["depends_on"]


def test_every_broker_and_node_variable_is_a_setting(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for key, value in env(svc).items():
            if key.startswith("BROKER_"):
                load_settings(BrokerSettings, [], {key: value}, "BROKER_")  # SystemExit on a bad value
                assert key.removeprefix("BROKER_").lower() in BrokerSettings.__dataclass_fields__, (name, key)
            elif key.startswith("NODE_"):
                load_node_settings([], {key: value})


def compose_cli() -> list[str]:
    """The Compose CLI to validate with: Debian's ``docker-compose`` (1.29, scripts/packages/dev.txt), else the
    ``docker compose`` plugin; skips with the reason where neither runs."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") is None:
        pytest.skip("neither docker-compose nor the docker CLI is installed (scripts/setup.sh installs docker-compose)")
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"no docker-compose, and no docker compose plugin: {probe.stderr.strip() or probe.stdout.strip()}")
    return ["docker", "compose"]


def compose_config(path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """``config`` of ``path`` in an environment holding only ``variables`` (no .env beside a temp copy)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), **variables}
    return subprocess.run([*compose_cli(), "-f", str(path), "config"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=path.parent)


def test_docker_compose_resolves_the_file_into_the_whole_system() -> None:
    """The real Compose CLI reads the file (anchors, merge keys, interpolation, depends_on conditions) the
    way ``up`` would; every variable has a default, and the shared secrets reach both of their sides."""
    r = compose_config(COMPOSE, TURN_SECRET="turn-from-env", BROKER_NODE_TOKEN="node-from-env")
    assert r.returncode == 0, r.stderr
    assert "variable is not set" not in r.stderr, r.stderr
    svc = yaml.safe_load(r.stdout)["services"]
    assert set(svc) == {"broker-1", "broker-2", "redis-master", "redis-replica", "sentinel-1", "sentinel-2",
                        "sentinel-3", "postgres", "coturn", "node", "node-gpu"}
    for name, host_port in (("broker-1", 8080), ("broker-2", 8081)):
        b = svc[name]
        assert Path(b["build"]["context"]) == ROOT and b["build"]["dockerfile"] == "infra/docker/broker.Dockerfile"
        assert [(p["published"], p["target"]) for p in b["ports"]] == [(host_port, 8080)]
        assert b["environment"] == svc["broker-1"]["environment"]  # replicas differ only in their host port
        assert b["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert b["environment"]["BROKER_REDIS_SENTINELS"].split(",") == [
            f"sentinel-{i}:26379" for i in (1, 2, 3)]
        assert b["environment"]["BROKER_TURN_SECRET"] == "turn-from-env"
        assert b["environment"]["BROKER_NODE_TOKEN"] == "node-from-env"
    assert "healthcheck" in svc["postgres"]
    sentinel = svc["sentinel-1"]
    assert "sentinel monitor render-broker redis-master 6379 2" in sentinel["command"][2]
    assert svc["sentinel-2"] == sentinel == svc["sentinel-3"]
    assert svc["redis-replica"]["command"][-4:-2] == ["redis-master", "6379"]
    assert "--static-auth-secret=turn-from-env" in svc["coturn"]["command"]
    for name in ("node", "node-gpu"):
        n = svc[name]
        assert n["build"]["dockerfile"] == "infra/docker/render-node.Dockerfile"
        assert n["environment"]["NODE_NODE_TOKEN"] == "node-from-env"
        assert n["depends_on"] == {"broker-1": {"condition": "service_healthy"}}
    assert svc["node-gpu"]["profiles"] == ["gpu"]
    assert svc["node-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_docker_compose_refuses_a_dependency_on_a_missing_service(tmp_path: Path) -> None:
    """The CLI above does check: the same file with one misspelt dependency is refused, naming it."""
    text = COMPOSE.read_text()
    assert "depends_on: [redis-master]" in text
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("depends_on: [redis-master]", "depends_on: [redis-mastr]", 1))
    r = compose_config(broken)
    assert r.returncode != 0 and "redis-mastr" in r.stderr, r.stderr
