"""A bounded schemathesis run against a live broker's own OpenAPI document: no 5xx, and responses as documented.

A real ``render-broker serve`` (real Redis, SQLite) with a pool, a registered host and a user session in it;
schemathesis (its CLI, as an operator would run it) generates requests for every operation from
``/api/v1/openapi.json`` (coverage and fuzzing phases, a fixed seed) as the admin, as a user and as a host's
node credential, and checks every response: no server error, status codes, content types and bodies as the
document says.  Bounded: a few examples per operation, about 20 s a role on the 2-core machine.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from broker.auth import mint_node_credential, mint_user_token
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process

pytestmark = pytest.mark.timeout(240)

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# one worker: hypothesis parses lambda sources with ast, which CPython 3.11 can break when two threads compile at
# once ("AST constructor recursion depth mismatch", seen with -w 2)
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
EXAMPLES = 3  # per operation and phase


async def _seed(url: str) -> None:
    """A pool with one registered host and one live user session, so id-bearing routes can find something."""
    async with aiohttp.ClientSession(headers=auth(ADMIN)) as http:
        async with http.put(f"{url}/api/v1/pools/fz", json={"max_sessions_per_gpu": 2}) as r:
            assert r.status == 201, await r.text()
        host = {"id": "fz-h0", "pool": "fz", "address": "fz-h0:1", "gpus": [
            {"index": 0, "model": "NVIDIA L4", "vram_mb": 24_576, "encoder_session_limit": None}]}
        async with http.post(f"{url}/api/v1/hosts", json=host, headers=auth(NODE)) as r:
            assert r.status == 201, await r.text()
        user = mint_user_token(SECRET, "fuzzer", time.time(), 3600)[0]
        async with http.post(f"{url}/api/v1/sessions", json={"pool": "fz"}, headers=auth(user)) as r:
            assert r.status == 201, await r.text()


async def _run(url: str, token: str, workdir: Path, label: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(SCHEMATHESIS), "run", f"{url}/api/v1/openapi.json", "-H", f"Authorization: Bearer {token}",
        "-n", str(EXAMPLES), "--seed", "7", "--phases", "coverage,fuzzing", "-c", CHECKS, "--no-shrink",
        "-w", "1", "--request-timeout", "20", "--output-truncate", "false", "--report", "junit",
        "--report-dir", str(workdir / label), cwd=workdir,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 200)
    return proc.returncode or 0, out.decode(errors="replace")


@pytest.mark.skipif(not SCHEMATHESIS.exists(), reason="schemathesis is not installed (the test extra has it)")
async def test_the_live_api_matches_its_openapi_document_and_never_answers_5xx(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_LOG_LEVEL": "warning", "BROKER_AUTOSCALE_INTERVAL_S": "0"}
    async with broker_process(env, str(tmp_path / "broker.log")) as broker:
        await _seed(broker.url)
        tokens = {"admin": ADMIN, "user": mint_user_token(SECRET, "fuzzer", time.time(), 3600)[0],
                  "node": mint_node_credential(SECRET, "fz-h0", time.time(), 3600)[0]}
        for label, token in tokens.items():
            rc, out = await _run(broker.url, token, tmp_path, label)
            assert rc == 0, f"schemathesis as {label} (exit {rc}):\n{out[-6000:]}"
            assert "passed" in out and " 0 passed" not in out, out[-2000:]
    log = (tmp_path / "broker.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
