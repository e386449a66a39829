"""``render-node doctor``: the report is the inventory the node registers, and requirements fail loudly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamer.node.doctor import GpuReport, requirement_failures


def _gpu(index: int, encode: str, gl: str, gl_ok: bool = True) -> GpuReport:
    return GpuReport(index=index, model="NVIDIA H200", vram_mb=143_771, encode=encode, seats_limit=2,
                     seats_reason="r", nvenc="OpenEncodeSessionEx failed" if encode == "software" else "ok",
                     gl_ok=gl_ok, gl_renderer=gl, telemetry={})


def test_requirements_name_each_failing_gpu() -> None:
    gpus = [_gpu(0, "software", "NVIDIA H200/PCIe/SSE2"), _gpu(1, "nvenc", "llvmpipe (LLVM 15.0.6, 256 bits)")]
    assert requirement_failures(gpus, True, require_gpu=True, require_gl=False, require_nvenc=False) == []
    assert requirement_failures(gpus, True, require_gpu=False, require_gl=True, require_nvenc=True) == [
        "GPU 0 (NVIDIA H200): NVENC unavailable: OpenEncodeSessionEx failed",
        "GPU 1 (NVIDIA H200): OpenGL does not run on the GPU: llvmpipe (LLVM 15.0.6, 256 bits)",
    ]
    failed = [_gpu(0, "nvenc", "no OpenGL on EGL device 0: ...", gl_ok=False)]
    assert requirement_failures(failed, True, require_gpu=False, require_gl=True, require_nvenc=False) == [
        "GPU 0 (NVIDIA H200): OpenGL does not run on the GPU: no OpenGL on EGL device 0: ..."]


def test_no_gpu_fails_every_gpu_requirement_once() -> None:
    cpu = [_gpu(0, "software", "llvmpipe")]
    assert requirement_failures(cpu, False, require_gpu=False, require_gl=False, require_nvenc=False) == []
    for flags in ({"require_gpu": True}, {"require_gl": True}, {"require_nvenc": True}):
        args = {"require_gpu": False, "require_gl": False, "require_nvenc": False, **flags}
        assert requirement_failures(cpu, False, **args) == [
            "no NVIDIA GPU found by NVML (see the first line for why)"]


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamer", "doctor", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_doctor_on_this_machine_reports_what_the_node_registers() -> None:
    from streamer.node.inventory import take_inventory

    inv = take_inventory(3)
    out = _doctor("--json", "--seats", "3")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gpu_render"] == inv.gpu_render and report["failures"] == []
    assert [(g["index"], g["encode"], g["seats_limit"]) for g in report["gpus"]] == [
        (g.index, g.encode, g.encoder_session_limit) for g in inv.gpus]
    assert report["software_encoders"]["libx264"].startswith("ok: ")


def test_doctor_exits_non_zero_with_the_reason_when_a_requirement_fails() -> None:
    from streamer.node.gpus import read_gpus

    hardware, why = read_gpus()
    if hardware:
        pytest.skip(f"this host has NVIDIA GPUs ({why}): --require-gpu is met here")
    out = _doctor("--require-gpu")
    assert out.returncode == 1
    assert "REQUIREMENTS FAILED" in out.stdout and "no NVIDIA GPU found by NVML" in out.stdout
    assert why in out.stdout


def test_doctor_reports_sound_and_require_audio_fails_without_pulseaudio() -> None:
    from streamer.desktop.audio import audio_available
    from streamer.node.doctor import audio_report

    assert audio_report(None).startswith("ok: ")
    assert audio_report("pulseaudio not installed").startswith("desktop sessions will be silent: pulseaudio")
    if audio_available() is not None:
        pytest.skip(f"no audio server here: {audio_available()}")
    out = _doctor("--json", "--require-audio")
    assert out.returncode == 0, out.stdout
    assert json.loads(out.stdout)["audio"].startswith("ok: ")
    bare = subprocess.run([sys.executable, "-m", "streamer", "doctor", "--require-audio"], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "PATH": "/nonexistent"})
    assert bare.returncode == 1 and "no sound for desktop sessions: pulseaudio and parec not installed" in bare.stdout


def test_doctor_reports_gamepads_and_require_gamepad_fails_with_the_probes_reason() -> None:
    from streamer.desktop.uinput import probe_uinput
    from streamer.node.doctor import gamepad_report

    assert gamepad_report(None).startswith("ok: ")
    assert gamepad_report("no /dev/uinput (x)").startswith("desktop sessions get no gamepads: no /dev/uinput")
    missing = probe_uinput()
    out = _doctor("--json", "--require-gamepad")
    report = json.loads(out.stdout)
    if missing is None:
        assert out.returncode == 0 and report["gamepad"].startswith("ok: ")
    else:
        assert out.returncode == 1
        assert f"no gamepads for desktop sessions: {missing}" in report["failures"]
        assert missing in report["gamepad"]
