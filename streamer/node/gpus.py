"""GPU inventory and telemetry for the node: NVML where a driver exists, else a declared inventory.

``probe_gpus`` returns what the node registers with the broker; ``telemetry``
returns the heartbeat's per-GPU figures.  NVML (nvidia-ml-py) is imported and
initialised lazily; any NVML failure (no library, no driver, no device) falls
back to the declared inventory with the reason logged, so the same node runs
on a GPU host and on a CPU-encode host.

Encoder session limits: consumer GeForce cards cap concurrent NVENC sessions
(the driver enforces it; NVML does not report the cap), datacenter and
professional cards do not.  ``nvenc_session_limit`` encodes that rule and the
node config can override it.  Cards without an NVENC unit (H100/H200 class)
get limit 0 for NVENC; such hosts encode in software.

Concurrency: blocking NVML calls; callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

GEFORCE_NVENC_SESSION_LIMIT = 8  # concurrent NVENC sessions on GeForce drivers (since 2023 drivers)
NO_NVENC_MODELS = ("H100", "H200", "A100", "A30", "B200")  # compute parts without an NVENC unit


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str
    vram_mb: int
    encoder_session_limit: int | None
    nvenc: bool

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def nvenc_session_limit(model: str) -> tuple[bool, int | None]:
    """(has NVENC, concurrent session limit or None for unlimited) for a GPU model name."""
    upper = model.upper()
    if any(m in upper for m in NO_NVENC_MODELS):
        return False, None
    if "GEFORCE" in upper or "TITAN" in upper:
        return True, GEFORCE_NVENC_SESSION_LIMIT
    return True, None


def declared_inventory(seats: int, model: str = "cpu-x264", vram_mb: int = 65_536) -> list[GpuInfo]:
    """A CPU-encode host: one pseudo-GPU whose encoder limit is the host's seat count."""
    return [GpuInfo(0, model, vram_mb, seats, False)]


def probe_gpus() -> tuple[list[GpuInfo], str]:
    """NVML inventory, or ([], reason) when NVML cannot be used here."""
    try:
        import pynvml
    except ImportError as exc:
        return [], f"nvidia-ml-py not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            model = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            has, limit = nvenc_session_limit(model)
            out.append(GpuInfo(i, model, int(mem.total // (1024 * 1024)), limit if has else 0, has))
        return out, f"NVML: {len(out)} GPU(s)"
    finally:
        pynvml.nvmlShutdown()


def telemetry(indexes: list[int]) -> list[dict[str, Any]]:
    """Per-GPU utilization, VRAM, encoder utilization/sessions, temperature, power (NVML), else bare indexes."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: telemetry is just the indexes (CPU hosts)
        return [{"index": i} for i in indexes]
    try:
        out = []
        for i in indexes:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            enc_util, _period = pynvml.nvmlDeviceGetEncoderUtilization(h)
            sessions, _fps, _lat = pynvml.nvmlDeviceGetEncoderStats(h)
            out.append({
                "index": i, "utilization": float(util.gpu), "vram_used_mb": mem.used / (1024 * 1024),
                "encoder_utilization": float(enc_util), "encoder_sessions": int(sessions),
                "temperature_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            })
        return out
    finally:
        pynvml.nvmlShutdown()
