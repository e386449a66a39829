"""Start Debian's coturn with the arguments a deployment file gives it, to prove they are accepted."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import pytest

from rbcommon.procs import terminate_group

needs_turnserver = pytest.mark.skipif(shutil.which("turnserver") is None,
                                      reason="coturn is not installed (Debian package coturn)")


async def coturn_accepts(args: Sequence[str], port: int, timeout_s: float = 30.0) -> None:
    """Run ``turnserver ARGS`` on 127.0.0.1:``port`` (its listening port replaced) until it accepts a TCP
    connection; AssertionError with its output if it exits first (an unknown option prints the usage)."""
    argv = ["turnserver", "-n", *(a for a in args if not a.startswith(("--listening-port=", "--listening-ip="))),
            f"--listening-port={port}", "--listening-ip=127.0.0.1"]
    log = tempfile.TemporaryFile()  # closed below; a pipe nobody reads could fill and block coturn
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                break
            with contextlib.suppress(OSError):
                _r, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.2)  # exits on a bad option; else keep polling
        log.seek(0)
        out = log.read(4000).decode(errors="replace")
        raise AssertionError(f"turnserver did not start (exit {proc.returncode}): {out}")
    finally:
        if proc.returncode is None:
            await terminate_group(proc, 10.0)
        log.close()
