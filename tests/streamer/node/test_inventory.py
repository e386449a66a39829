"""The inventory a node registers: NVML hardware + per-GPU NVENC probes -> seats, with reasons."""

from __future__ import annotations

from encoder.backends import ProbeResult
from streamer.node.gpus import GpuHardware
from streamer.node.inventory import take_inventory


def _probe(ok_on: set[int]):
    calls: list[int] = []

    def probe(gpu: int) -> ProbeResult:
        calls.append(gpu)
        ok = gpu in ok_on
        return ProbeResult("h264_nvenc", ok, "8 frames encoded" if ok else "OpenEncodeSessionEx failed: no encode "
                                                                           "capable devices found", 12.0)
    return probe, calls


def test_each_gpu_is_probed_on_itself_and_a_gpu_without_nvenc_still_gets_seats() -> None:
    hardware = [GpuHardware(0, "NVIDIA L4", 23_034), GpuHardware(1, "NVIDIA H200", 143_771),
                GpuHardware(2, "NVIDIA H200", 143_771)]
    probe, calls = _probe({0})
    inv = take_inventory(3, probe, lambda: (hardware, "NVML: 3 GPU(s)"))
    assert calls == [0, 1, 2]  # one probe per GPU, on that GPU
    assert inv.gpu_render and inv.reason == "NVML: 3 GPU(s)"
    assert [(g.index, g.encode, g.nvenc, g.encoder_session_limit) for g in inv.gpus] == [
        (0, "nvenc", True, None), (1, "software", False, 2), (2, "software", False, 1)]
    assert "no NVENC unit" in inv.gpus[1].reason
    assert "GPU 1 NVIDIA H200: software, limit 2" in inv.seats_note


def test_an_nvenc_card_whose_probe_fails_encodes_in_software() -> None:
    probe, _ = _probe(set())
    inv = take_inventory(2, probe, lambda: ([GpuHardware(0, "NVIDIA GeForce RTX 4090", 24_564)], "NVML: 1 GPU(s)"))
    (g,) = inv.gpus
    assert (g.encode, g.encoder_session_limit) == ("software", 2)
    assert "NVENC probe did not encode" in g.reason and inv.nvenc[0].reason.startswith("OpenEncodeSessionEx")


def test_without_nvml_the_host_declares_its_software_seats() -> None:
    probe, calls = _probe({0})
    inv = take_inventory(4, probe, lambda: ([], "NVML unavailable: NVML Shared Library Not Found"))
    assert calls == [] and not inv.gpu_render
    (g,) = inv.gpus
    assert (g.model, g.encoder_session_limit, g.encode) == ("cpu-x264", 4, "software")
    assert inv.reason.startswith("NVML unavailable") and "4 declared seat(s)" in inv.reason
