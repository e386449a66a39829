"""``render-node doctor``: what this host will do, and whether that meets what the operator requires.

Job: take the same inventory the agent registers (``streamer.node.inventory``), add what a session
would see on each GPU -- the OpenGL renderer an EGL context gets there, the NVENC probe, one NVML
telemetry read -- plus the software encoders, print it as a report (or ``--json``), and exit
non-zero with the reason when a stated requirement fails:

- ``--require-gpu``: NVML must list at least one GPU;
- ``--require-gl``: every GPU must give an OpenGL context on the GPU (not Mesa's llvmpipe);
- ``--require-nvenc``: every GPU must encode with NVENC;
- ``--require-audio``: desktop sessions must get sound (``pulseaudio`` and ``parec`` installed);
- ``--require-gamepad``: desktop sessions must get virtual gamepads (``/dev/uinput`` writable).

Concurrency model: a synchronous command (no event loop); probes block the calling thread.
Exit status: 0 all requirements met, 1 a requirement failed (each reason printed), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from encoder.backends import BACKENDS
from encoder.probe import probe_all
from streamer.desktop.audio import audio_available
from streamer.desktop.glgame import probe_gl
from streamer.desktop.uinput import probe_uinput
from streamer.node.gpus import GpuTelemetry
from streamer.node.inventory import Inventory, take_inventory

SOFTWARE_RENDERERS = ("llvmpipe", "softpipe", "swrast", "lavapipe")  # Mesa's CPU rasterizers


@dataclass(frozen=True)
class GpuReport:
    index: int
    model: str
    vram_mb: int
    encode: str  # "nvenc" | "software"
    seats_limit: int | None  # encoder_session_limit the broker caps this GPU's seats with
    seats_reason: str
    nvenc: str  # the NVENC probe's summary or failure reason
    gl_ok: bool
    gl_renderer: str  # GL_RENDERER of an EGL context on this GPU, or why none was made
    telemetry: dict[str, Any]

    @property
    def renders_on_gpu(self) -> bool:
        low = self.gl_renderer.lower()
        return self.gl_ok and not any(s in low for s in SOFTWARE_RENDERERS)


@dataclass(frozen=True)
class Report:
    reason: str  # NVML's summary or why this is a CPU-encode host
    gpu_render: bool
    gpus: list[GpuReport]
    software_encoders: dict[str, str]  # backend -> "ok: ..." or the failure reason
    failures: list[str]
    audio: str = ""  # "ok: ..." or why desktop sessions will be silent
    gamepad: str = ""  # "ok: ..." or why desktop sessions get no gamepads


def requirement_failures(report_gpus: Sequence[GpuReport], gpu_render: bool, *, require_gpu: bool,
                         require_gl: bool, require_nvenc: bool) -> list[str]:
    """The requirements this host fails, one sentence each (pure)."""
    out: list[str] = []
    if (require_gpu or require_gl or require_nvenc) and not gpu_render:
        out.append("no NVIDIA GPU found by NVML (see the first line for why)")
        return out
    for g in report_gpus:
        if require_gl and not g.renders_on_gpu:
            out.append(f"GPU {g.index} ({g.model}): OpenGL does not run on the GPU: {g.gl_renderer}")
        if require_nvenc and g.encode != "nvenc":
            out.append(f"GPU {g.index} ({g.model}): NVENC unavailable: {g.nvenc}")
    return out


def examine(software_seats: int, *, inventory_fn: Callable[[int], Inventory] = take_inventory,
            gl_probe: Callable[[int | None], tuple[bool, str]] = probe_gl) -> tuple[Inventory, list[GpuReport],
                                                                                       dict[str, str]]:
    """Inventory, per-GPU report and software encoder probes. Blocking."""
    inv = inventory_fn(software_seats)
    tel = {t["index"]: t for t in GpuTelemetry().read([g.index for g in inv.gpus])} if inv.gpu_render else {}
    rows = []
    for g in inv.gpus:
        gl_ok, gl_text = gl_probe(g.index if inv.gpu_render else None)
        probe = inv.nvenc.get(g.index)
        rows.append(GpuReport(
            index=g.index, model=g.model, vram_mb=g.vram_mb, encode=g.encode, seats_limit=g.encoder_session_limit,
            seats_reason=g.reason, nvenc=probe.reason if probe is not None else "not probed (no NVML GPU)",
            gl_ok=gl_ok, gl_renderer=gl_text, telemetry=tel.get(g.index, {}),
        ))
    software = {r.name: ("ok: " + r.reason if r.ok else r.reason)
                for r in probe_all(tuple(b for b in BACKENDS if not b.hardware))}
    return inv, rows, software


def audio_report(missing: str | None) -> str:
    """The doctor's audio line from ``audio_available()``'s answer (pure)."""
    if missing is None:
        return "ok: pulseaudio and parec found (desktop sessions get their own sound server); game sound in-process"
    return f"desktop sessions will be silent: {missing}; game sound in-process"


def gamepad_report(missing: str | None) -> str:
    """The doctor's gamepad line from ``probe_uinput()``'s answer (pure)."""
    if missing is None:
        return "ok: /dev/uinput writable (desktop sessions get virtual gamepads); the built-in game reads pads itself"
    return f"desktop sessions get no gamepads: {missing}; the built-in game reads pads itself"


def format_report(report: Report) -> str:
    lines = [f"GPUs: {report.reason}"]
    for g in report.gpus:
        lines.append(f"GPU {g.index}: {g.model}, {g.vram_mb} MiB")
        lines.append(f"  OpenGL (EGL): {'ok' if g.gl_ok else 'FAILED'}: {g.gl_renderer}"
                     + ("" if g.renders_on_gpu or not report.gpu_render else "  [not on the GPU]"))
        lines.append(f"  NVENC: {g.nvenc}")
        lines.append(f"  encode: {g.encode}; seat limit {g.seats_limit if g.seats_limit is not None else 'none'}"
                     f" ({g.seats_reason})")
        shown = {k: v for k, v in g.telemetry.items() if k != "index"}
        lines.append("  telemetry: " + (", ".join(f"{k}={v}" for k, v in shown.items()) or "none"))
    lines.append("software encoders: " + "; ".join(f"{k}: {v}" for k, v in report.software_encoders.items()))
    lines.append(f"audio: {report.audio}")
    lines.append(f"gamepad: {report.gamepad}")
    if report.failures:
        lines.append("REQUIREMENTS FAILED:")
        lines.extend(f"  - {f}" for f in report.failures)
    else:
        lines.append("requirements: met")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, *, software_seats: int = 2) -> int:
    parser = argparse.ArgumentParser(prog="render-node doctor",
                                     description="Print what this host will do (GPUs, GL renderer, encoders, "
                                                 "seats) and check stated requirements.")
    parser.add_argument("--require-gpu", action="store_true", help="fail unless NVML lists a GPU")
    parser.add_argument("--require-gl", action="store_true", help="fail unless OpenGL runs on every GPU")
    parser.add_argument("--require-nvenc", action="store_true", help="fail unless every GPU encodes with NVENC")
    parser.add_argument("--require-audio", action="store_true",
                        help="fail unless desktop sessions get sound (pulseaudio and parec installed)")
    parser.add_argument("--require-gamepad", action="store_true",
                        help="fail unless desktop sessions get virtual gamepads (/dev/uinput writable)")
    parser.add_argument("--seats", type=int, default=software_seats,
                        help="software-encode seat budget (the node's --seats) [default: %(default)s]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    ns = parser.parse_args(argv)
    inv, rows, software = examine(ns.seats)
    failures = requirement_failures(rows, inv.gpu_render, require_gpu=ns.require_gpu, require_gl=ns.require_gl,
                                    require_nvenc=ns.require_nvenc)
    audio_missing = audio_available()
    if ns.require_audio and audio_missing:
        failures.append(f"no sound for desktop sessions: {audio_missing}")
    gamepad_missing = probe_uinput()
    if ns.require_gamepad and gamepad_missing:
        failures.append(f"no gamepads for desktop sessions: {gamepad_missing}")
    report = Report(inv.reason, inv.gpu_render, rows, software, failures, audio=audio_report(audio_missing),
                    gamepad=gamepad_report(gamepad_missing))
    if ns.json:
        print(json.dumps({**asdict(report), "gpus": [{**asdict(g), "renders_on_gpu": g.renders_on_gpu}
                                                    for g in rows]}, indent=2))
    else:
        print(format_report(report))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
