"""The images (infra/docker) stay in step with scripts/setup.sh and pyproject, without building them.

One source for Debian packages: scripts/packages/{broker,node,dev}.txt, installed by
scripts/packages/install.sh, which setup.sh and both Dockerfiles call.  These tests read the
Dockerfiles as text (no Docker engine runs here, and a build would need the network).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import ssl
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "scripts" / "packages"
DOCKER = ROOT / "infra" / "docker"
IMAGES = {"broker": DOCKER / "broker.Dockerfile", "node": DOCKER / "render-node.Dockerfile"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        op, _, args = buf.strip().partition(" ")
        out.append((op.upper(), args.strip()))
        buf = ""
    return out


def package_list(name: str) -> list[str]:
    """The list as Python reads it (comments and blanks dropped)."""
    names = []
    for line in (PACKAGES / f"{name}.txt").read_text().splitlines():
        p = line.split("#", 1)[0].strip()
        if p:
            names.append(p)
    return names


def install_calls(text: str) -> list[list[str]]:
    """The list names of every ``install.sh LIST...`` call in a shell/RUN text."""
    return [m.split() for m in re.findall(r"packages/install\.sh((?: +[a-z]+)+)", text)]


def test_install_sh_reads_the_lists_as_the_tests_do() -> None:
    for name in ("broker", "node", "dev"):
        printed = subprocess.run(["bash", str(PACKAGES / "install.sh"), "--print", name], check=True,
                                 capture_output=True, text=True).stdout.split()
        assert printed == package_list(name) and printed, name
        assert len(set(printed)) == len(printed), f"{name}.txt lists a package twice"
        assert all(re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", p) for p in printed), printed
    bad = subprocess.run(["bash", str(PACKAGES / "install.sh"), "--print", "nosuch"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no package list" in bad.stderr


def test_setup_sh_installs_every_list() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert sorted(n for call in install_calls(setup) for n in call) == sorted(p.stem for p in PACKAGES.glob("*.txt"))
    assert "apt-get install" not in setup  # no second, diverging list


@pytest.mark.parametrize("role", sorted(IMAGES))
def test_each_image_installs_exactly_its_list_and_nothing_else(role: str) -> None:
    steps = instructions(IMAGES[role])
    runs = " ; ".join(args for op, args in steps if op == "RUN")
    assert install_calls(runs) == [[role]]
    assert "apt-get install" not in runs and "apt install" not in runs
    assert ("COPY", "scripts/packages/ /tmp/packages/") in steps
    assert steps[0] == ("FROM", "python:3.11-slim-bookworm")


@pytest.mark.parametrize("role", sorted(IMAGES))
def test_python_extras_exist_and_every_package_is_copied(role: str) -> None:
    steps = instructions(IMAGES[role])
    [pip] = [args for op, args in steps if op == "RUN" and "pip install" in args]
    target = shlex.split(pip)[-1]
    m = re.fullmatch(r"\.(?:\[([a-z,-]+)\])?", target)
    assert m, f"pip installs {target!r}, expected the project ('.' or '.[extras]')"
    extras = set(m.group(1).split(",")) if m.group(1) else set()
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    assert ("kubernetes" in extras) == (role == "broker")  # the broker runs the kubernetes provider
    copied = {src.rstrip("/") for op, args in steps if op == "COPY" for src in args.split()[:-1]}
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", "README.md", "web"} <= copied  # pip -e needs them; web/ is served
    for src in copied:
        assert (ROOT / src).exists(), src
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not copied & set(ignored)


@pytest.mark.parametrize("role", sorted(IMAGES))
def test_non_root_healthcheck_and_tini(role: str) -> None:
    steps = dict(instructions(IMAGES[role]))
    assert steps["USER"].isdigit() and int(steps["USER"]) != 0
    assert re.search(rf'healthcheck\.py", "{role}"\]$', steps["HEALTHCHECK"])
    assert steps["ENTRYPOINT"] == '["tini", "--"]' and "tini" in package_list(role)
    env = dict(kv.split("=", 1) for kv in shlex.split(" ".join(a for op, a in instructions(IMAGES[role])
                                                                if op == "ENV")))
    if role == "node":
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "all" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert {"xvfb", "openbox", "pulseaudio", "libglvnd0", "libegl1"} <= set(package_list("node"))
        assert steps["CMD"] == '["render-node"]' and env["NODE_HEALTH_PORT"] == "8090"
    else:
        assert steps["CMD"] == '["render-broker", "serve"]' and env["BROKER_HOST"] == "0.0.0.0"


async def run_healthcheck(role: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, str(DOCKER / "healthcheck.py"), role, env=env,
                                                stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_broker_healthcheck_probes_a_real_brokers_readyz_over_tls(aiohttp_server, settings_factory, clock,
                                                                       tmp_path: Path) -> None:
    """The image's probe against a real broker app (real Redis + SQL) serving HTTPS, as BROKER_TLS_CERT makes it."""
    from broker.app import create_app
    from tests.tlsutil import make_ca

    ca = make_ca(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.issue(cert, key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    server = await aiohttp_server(create_app(settings_factory(), clock=clock), ssl=ctx)
    env = {"BROKER_PORT": str(server.port), "BROKER_TLS_CERT": str(cert)}
    assert await run_healthcheck("broker", env) == (0, "")
    code, err = await run_healthcheck("broker", {"BROKER_PORT": str(server.port)})  # plain HTTP to a TLS port
    assert code == 1 and f"http://127.0.0.1:{server.port}/readyz" in err


async def test_node_healthcheck_probes_the_nodes_own_health_endpoint(unused_tcp_port_factory) -> None:
    from streamer.node.health import NodeHealth
    from streamer.node.watchdog import Limits

    health = NodeHealth(Limits())
    port = unused_tcp_port_factory()
    runner = await health.serve("127.0.0.1", port)
    env = {"NODE_HEALTH_PORT": str(port)}
    try:
        code, err = await run_healthcheck("node", env)  # not registered yet: 503
        assert code == 1 and f"127.0.0.1:{port}/healthz" in err and "503" in err
        health.registered = True
        health.beat(True)
        assert await run_healthcheck("node", env) == (0, "")
        health.beat(False)  # heartbeats stopped reaching the broker
        assert (await run_healthcheck("node", env))[0] == 1
    finally:
        await runner.cleanup()
    code, err = await run_healthcheck("node", env)  # nothing listens now
    assert code == 1 and "refused" in err.lower()
