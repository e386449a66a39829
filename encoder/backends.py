"""Encoder backends as data, in priority order (pure).

Job: describe every video encoder we know how to drive -- FFmpeg codec name,
FFmpeg options, accepted input pixel formats, the WebRTC codec it produces,
how it follows bitrate changes -- and build the option dictionary a codec is
opened with for a given size, frame rate, bitrate and thread count. Also
holds ``ProbeResult``, what a probe learned about one backend on this machine.

Concurrency model: none. Module-level values are immutable (frozen
dataclasses, tuples); functions are pure. No PyAV import: the probe
(``encoder.probe``) and the encoder (``encoder.video``) do the I/O.

Invariants every backend keeps (the probe verifies them by encoding):
- low latency: no B-frames, no lookahead, one packet out per frame in;
- infinite GOP: the first frame and requested frames are the only keyframes;
- SPS/PPS (or sequence headers) are repeated in every keyframe: we never set
  the global-header flag, so every keyframe can start a decoder;
- H.264 is constrained baseline (profile_idc 66, constraint_set1), the
  profile aiortc offers as 42e01f.
Order of ``BACKENDS`` is priority order: hardware first, software last.
"""

from __future__ import annotations

from dataclasses import dataclass

from encoder.ratecontrol import X264_CLAMPED_BUFSIZE_BITS, BitrateChange, RateControl

# WebRTC codec names, as they appear in SDP rtpmap lines.
WEBRTC_H264 = "H264"
WEBRTC_VP8 = "VP8"
WEBRTC_HEVC = "HEVC"
WEBRTC_AV1 = "AV1"

# What aiortc 1.16 can packetize (RTCRtpSender + codecs/h264.py, codecs/vpx.py).
AIORTC_VIDEO_CODECS: frozenset[str] = frozenset({WEBRTC_H264, WEBRTC_VP8})

# "No periodic keyframes": GOP length in frames handed to encoders that take a
# number (about 414 days at 60 fps). x264 gets keyint=infinite instead.
GOP_INFINITE_FRAMES = 2**31 - 1

# libvpx CBR buffer in milliseconds of the target bitrate. Small, so P-frames
# cannot burst far past their share; keyframes are capped by max-intra-rate.
VPX_BUFFER_MS = 100

# SVT-AV1 rejects rate buffers under 20 ms (one frame at 60 fps is 16.7 ms).
SVT_MIN_BUFFER_MS = 21

# H.264 levels (Table A-1): (name, max macroblocks/s, max frame size in
# macroblocks, max bitrate in kbit/s for baseline). Smallest fitting level wins;
# 3.1 is the floor because aiortc offers profile-level-id 42e01f.
_H264_LEVELS: tuple[tuple[str, int, int, int], ...] = (
    ("3.1", 108_000, 3_600, 14_000),
    ("3.2", 216_000, 5_120, 20_000),
    ("4", 245_760, 8_192, 20_000),
    ("4.1", 245_760, 8_192, 50_000),
    ("4.2", 522_240, 8_704, 50_000),
    ("5", 589_824, 22_080, 135_000),
    ("5.1", 983_040, 36_864, 240_000),
    ("5.2", 2_073_600, 36_864, 240_000),
)


@dataclass(frozen=True)
class Backend:
    """One encoder configuration. ``options`` are FFmpeg AVOptions (generic
    AVCodecContext options such as ``bf`` or private ones such as ``preset``);
    rate control, level and threads are added by ``codec_options``."""

    name: str  # what users and the selection refer to
    codec: str  # FFmpeg encoder name
    webrtc_codec: str  # codec name in SDP
    hardware: bool
    pix_fmts: tuple[str, ...]  # accepted input formats; the first is the conversion target
    options: tuple[tuple[str, str], ...]
    rate_style: str  # "x264" | "vpx" | "nvenc" | "svtav1": which rate options to add
    bitrate_change: BitrateChange
    headroom: float  # open ceiling = headroom * target: how far the target can rise live (ratecontrol)
    rate_factor: float  # codec rate = target * rate_factor (calibration, see ratecontrol)
    decoder: str  # FFmpeg decoder the probe and tests decode with
    yuv_matrix: str  # "bt709" | "bt601": RGB->YUV matrix, written to the VUI where the codec has one
    h264_level: bool = False  # add a computed H.264 level
    description: str = ""
    # FFmpeg option that picks the GPU the encoder opens on ("gpu" for NVENC: the CUDA device
    # ordinal); empty for software encoders, which have no device.
    device_option: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """What a probe learned about one backend on this machine."""

    name: str
    ok: bool
    reason: str  # why it failed, or a one-line summary of what worked
    probe_ms: float
    profile: str | None = None  # H.264 profile-level-id seen in the SPS, e.g. "42c01f"


_NVENC_COMMON: tuple[tuple[str, str], ...] = (
    ("preset", "p1"),  # fastest; p1-p4 are the low-latency range
    ("tune", "ull"),  # ultra-low latency
    ("rc", "cbr"),
    ("zerolatency", "1"),  # no reordering delay
    ("delay", "0"),  # packet out on the same call as the frame in
    ("forced-idr", "1"),  # pict_type I -> IDR, so a request starts a decoder
    ("rc-lookahead", "0"),
    ("no-scenecut", "1"),
    ("b_ref_mode", "disabled"),
    ("multipass", "disabled"),
    ("bf", "0"),
    ("g", str(GOP_INFINITE_FRAMES)),
)
_NVENC_PIX_FMTS = ("bgr0", "bgra", "nv12", "yuv420p")  # takes capture formats straight

BACKENDS: tuple[Backend, ...] = (
    Backend(
        name="h264_nvenc",
        codec="h264_nvenc",
        webrtc_codec=WEBRTC_H264,
        hardware=True,
        pix_fmts=_NVENC_PIX_FMTS,
        options=(*_NVENC_COMMON, ("profile", "baseline"), ("coder", "cavlc")),
        rate_style="nvenc",
        device_option="gpu",
        bitrate_change=BitrateChange.LIVE_IDR,  # FFmpeg's nvenc reconfig sets forceIDR
        headroom=1.0,
        rate_factor=1.0,
        decoder="h264",
        yuv_matrix="bt709",
        h264_level=True,
        description="NVIDIA NVENC H.264, constrained baseline, CBR, one-frame VBV",
    ),
    Backend(
        name="hevc_nvenc",
        codec="hevc_nvenc",
        webrtc_codec=WEBRTC_HEVC,
        hardware=True,
        pix_fmts=_NVENC_PIX_FMTS,
        options=(*_NVENC_COMMON, ("profile", "main")),
        rate_style="nvenc",
        device_option="gpu",
        bitrate_change=BitrateChange.LIVE_IDR,
        headroom=1.0,
        rate_factor=1.0,
        decoder="hevc",
        yuv_matrix="bt709",
        description="NVIDIA NVENC HEVC main, CBR, one-frame VBV",
    ),
    Backend(
        name="av1_nvenc",
        codec="av1_nvenc",
        webrtc_codec=WEBRTC_AV1,
        hardware=True,
        pix_fmts=_NVENC_PIX_FMTS,
        options=_NVENC_COMMON,
        rate_style="nvenc",
        device_option="gpu",
        bitrate_change=BitrateChange.LIVE_IDR,
        headroom=1.0,
        rate_factor=1.0,
        decoder="libdav1d",
        yuv_matrix="bt709",
        description="NVIDIA NVENC AV1 (Ada and newer), CBR, one-frame VBV",
    ),
    Backend(
        name="libx264",
        codec="libx264",
        webrtc_codec=WEBRTC_H264,
        hardware=False,
        pix_fmts=("yuv420p",),
        options=(
            ("preset", "ultrafast"),
            ("tune", "zerolatency"),  # no lookahead, sliced threads, no B-frames
            ("profile", "baseline"),
            ("forced-idr", "1"),
            ("sc_threshold", "0"),  # no scene-cut keyframes
            ("x264-params", "keyint=infinite"),
            ("bf", "0"),
            ("thread_type", "slice"),  # frame threads would add a frame of latency per thread
        ),
        rate_style="x264",
        bitrate_change=BitrateChange.LIVE,  # ABR + maxrate/bufsize follows ctx.bit_rate
        headroom=2.0,
        rate_factor=1.25,  # single-frame VBV undershoots; measured output 0.7-1.0 x target
        decoder="h264",
        yuv_matrix="bt709",
        h264_level=True,
        description="x264 ultrafast/zerolatency, constrained baseline, steered by a one-frame VBV",
    ),
    Backend(
        name="libvpx",
        codec="libvpx",
        webrtc_codec=WEBRTC_VP8,
        hardware=False,
        pix_fmts=("yuv420p",),
        options=(
            ("deadline", "realtime"),
            ("cpu-used", "8"),  # fastest realtime speed
            ("lag-in-frames", "0"),
            ("auto-alt-ref", "0"),
            ("static-thresh", "0"),
            ("max-intra-rate", "150"),  # keyframe target: 1.5 frames (cap 4); qmax limits how small
            ("undershoot-pct", "95"),
            ("overshoot-pct", "15"),
            ("qmin", "2"),
            ("qmax", "63"),  # allow coarse frames rather than bursts
            ("g", str(GOP_INFINITE_FRAMES)),
        ),
        rate_style="vpx",
        bitrate_change=BitrateChange.REOPEN,  # libvpx ignores live ctx.bit_rate changes
        headroom=1.0,
        rate_factor=1.0,
        decoder="vp8",
        yuv_matrix="bt601",  # VP8 has no colour signalling: decoders assume BT.601
        description="libvpx VP8 realtime, CBR",
    ),
    Backend(
        name="libsvtav1",
        codec="libsvtav1",
        webrtc_codec=WEBRTC_AV1,
        hardware=False,
        pix_fmts=("yuv420p",),
        options=(
            ("preset", "11"),
            ("svtav1-params", "rtc=1:pred-struct=1:rc=2:lookahead=0:keyint=-1"),  # RTC, low delay, CBR
        ),
        rate_style="svtav1",
        bitrate_change=BitrateChange.REOPEN,  # treated as ignoring live changes (conservative)
        headroom=1.0,
        rate_factor=1.0,
        decoder="libdav1d",
        yuv_matrix="bt709",
        description="SVT-AV1 real-time mode, CBR (only for peers that receive AV1)",
    ),
)


def backend_by_name(name: str, backends: tuple[Backend, ...] = BACKENDS) -> Backend:
    """The backend called ``name`` (case-insensitive); KeyError if none."""
    wanted = name.lower()
    for backend in backends:
        if backend.name.lower() == wanted:
            return backend
    raise KeyError(f"unknown encoder backend {name!r}; known: {', '.join(b.name for b in backends)}")


def h264_level(width: int, height: int, fps: float, maxrate_bps: int = 0) -> str:
    """Smallest H.264 level (>= 3.1) whose frame size, macroblock rate and
    baseline bitrate limits fit; the highest level when nothing fits."""
    mbs = ((width + 15) // 16) * ((height + 15) // 16)
    mbps = mbs * fps
    for name, max_mbps, max_fs, max_kbps in _H264_LEVELS:
        if mbs <= max_fs and mbps <= max_mbps and maxrate_bps <= max_kbps * 1000:
            return name
    return _H264_LEVELS[-1][0]


def codec_options(
    backend: Backend, rate: RateControl, width: int, height: int, threads: int, gpu: int | None = None
) -> dict[str, str]:
    """The FFmpeg option dictionary ``backend`` is opened with.

    Static options, then the rate-control options of the backend's style,
    the thread count, (H.264) the level and, for a hardware backend given a
    ``gpu`` (CUDA device ordinal), the option that opens it on that GPU.
    Bitrate itself is set on the context (``ctx.bit_rate``) so it can later
    change live.
    """
    opts = dict(backend.options)
    if gpu is not None and backend.device_option:
        if gpu < 0:
            raise ValueError(f"gpu must be >= 0, got {gpu}")
        opts[backend.device_option] = str(gpu)
    if backend.rate_style == "x264":
        # maxrate == bit_rate (CBR-like) and a sub-frame bufsize: see ratecontrol's docstring.
        opts["maxrate"] = str(rate.open_bitrate_bps)
        opts["bufsize"] = str(X264_CLAMPED_BUFSIZE_BITS)
    elif backend.rate_style == "nvenc":
        opts["maxrate"] = str(rate.open_bitrate_bps)
        opts["bufsize"] = str(rate.bufsize_bits)
    elif backend.rate_style == "vpx":
        # minrate == maxrate == bit_rate makes FFmpeg select VPX_CBR.
        opts["minrate"] = str(rate.open_bitrate_bps)
        opts["maxrate"] = str(rate.open_bitrate_bps)
        opts["bufsize"] = str(rate.open_bitrate_bps * VPX_BUFFER_MS // 1000)
    elif backend.rate_style == "svtav1":
        opts["bufsize"] = str(max(rate.bufsize_bits, rate.open_bitrate_bps * SVT_MIN_BUFFER_MS // 1000))
    else:
        raise ValueError(f"{backend.name}: unknown rate_style {backend.rate_style!r}")
    opts["threads"] = str(threads)
    if backend.h264_level:
        opts["level"] = h264_level(width, height, rate.fps, rate.open_bitrate_bps)
    matrix = "bt709" if backend.yuv_matrix == "bt709" else "smpte170m"
    # Colour description for the VUI (H.264/HEVC/AV1 write it; VP8 ignores it).
    opts.update(colorspace=matrix, color_primaries=matrix, color_trc=matrix, color_range="tv")
    return opts


def auto_threads(width: int, height: int) -> int:
    """Default encoder threads: 1 up to 720p, 2 above (the 2-core target)."""
    return 1 if width * height <= 1280 * 720 else 2
