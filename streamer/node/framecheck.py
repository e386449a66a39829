"""The stream self-test's picture and its checks: a stamped pattern, and the verdict on each decoded frame.

Job (pure; the effectful runner is ``streamer.node.selftest``):

- ``stamped_pattern(width, height, frame_no, ts_ms)``: frame ``frame_no`` of the moving test pattern
  (``encoder.pattern.moving_pattern``: gradients, a sliding checkerboard, fine stripes) with the
  built-in game's stamp strip (``streamer.desktop.game``: frame number, render time, CRC) drawn over
  its top rows.  Deterministic: the checker rebuilds the exact source of any frame from its stamp.
- ``source_picture``: that picture as a self-test source shows it, after an injected fault (``Mangle``).
- ``FrameTally``: fed every decoded frame (its luma plane) with whether the viewer side had to
  abandon stream data since the last keyframe (``refs_lost``), it reads the stamp, rebuilds the
  source, compares luma by PSNR and files the frame as
    * ``checked`` (stamp read, PSNR at or over the floor),
    * ``corrupt`` (stamp unreadable or PSNR under the floor, with every reference intact: a frame
      a browser would show wrong -- the self-test's goal is 0),
    * ``recovering`` (bad, but decoded after the receiver abandoned data and before the next
      keyframe: a browser's decoder would not show it; counted apart, never as corrupt);
  then ``summary`` adds the frames never decoded (gaps in the stamp numbers), the ones rendered
  outside the loss window and its recovery (unexplained), and the time from the end of the loss
  window to the first good frame rendered after it.

Pure: no clock (times are inputs), no I/O.  Not thread-safe: one owner (the runner's event loop).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import av
import numpy as np
import numpy.typing as npt

from encoder.pattern import moving_pattern, psnr
from streamer.desktop.game import read_stamp, stamp_bits, stamp_cell_maps, stamp_height

# Luma PSNR floor.  Measured here: libx264 at the self-test's 1.5 Mbps, 320x240, 30 fps: min 28.3 /
# median 32 dB; the pattern against its own previous (or 30th previous) frame: 15.4 (13.5) dB.
PSNR_FLOOR_DB: Final = 22.0
Luma = npt.NDArray[np.uint8]
Mangle = Callable[[int, npt.NDArray[np.uint8]], npt.NDArray[np.uint8]]  # (frame number, BGRA) -> BGRA: a fault


def stamped_pattern(width: int, height: int, frame_no: int, ts_ms: int) -> npt.NDArray[np.uint8]:
    """Frame ``frame_no`` of the moving pattern with its stamp strip on top, ``H x W x 4`` BGRA."""
    out = moving_pattern(width, height, frame_no)
    rows, cols = stamp_cell_maps(width)
    strip = stamp_bits(frame_no, ts_ms)[rows][:, cols]
    out[: stamp_height(width), :, :3] = strip[..., None]
    return out


def source_picture(width: int, height: int, frame_no: int, ts_ms: int,
                   mangle: Mangle | None = None) -> npt.NDArray[np.uint8]:
    """What a self-test source shows as frame ``frame_no``: ``stamped_pattern``, then ``mangle`` (a fault
    that tests and drills inject after the stamp is drawn) when one is given."""
    image = stamped_pattern(width, height, frame_no, ts_ms)
    return image if mangle is None else mangle(frame_no, image)


def luma(bgra: npt.NDArray[np.uint8]) -> Luma:
    """The Y plane of a BGRA picture as the encoders see it (swscale's BGRA -> yuv420p)."""
    frame = av.VideoFrame.from_ndarray(bgra, format="bgra").reformat(format="yuv420p")
    return np.asarray(frame.to_ndarray(), dtype=np.uint8)[: bgra.shape[0]]


@dataclass(frozen=True)
class FrameVerdict:
    kind: str  # checked | corrupt | recovering
    frame_no: int | None  # from the stamp, None when unreadable
    psnr_db: float | None
    detail: str = ""


@dataclass
class FrameTally:
    """Verdicts on every decoded frame of one self-test run (see the module docstring)."""

    width: int
    height: int
    psnr_floor_db: float = PSNR_FLOOR_DB
    checked: int = 0
    corrupt: int = 0
    recovering: int = 0
    psnrs: list[float] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    rendered_ms: dict[int, int] = field(default_factory=dict)  # frame number -> its stamp's render time
    first_corrupt: str = ""
    recovered_at_ms: float | None = None  # decode time of the first good frame rendered after the loss window

    def add(self, y: Luma, refs_lost: bool, decoded_ms: float, loss_end_ms: float | None = None) -> FrameVerdict:
        """File one decoded frame (``y``: its luma, full size); ``decoded_ms`` on the stamps' clock (epoch ms)."""
        stamp = read_stamp(y)
        verdict: FrameVerdict
        if stamp is None:
            verdict = FrameVerdict("recovering" if refs_lost else "corrupt", None, None, "stamp unreadable")
        else:
            ref = luma(stamped_pattern(self.width, self.height, stamp.frame_no, stamp.ts_ms))
            plane = y[: self.height]
            score = psnr(plane, ref) if plane.shape == ref.shape else 0.0  # a wrong size is a wrong picture
            if score >= self.psnr_floor_db:
                verdict = FrameVerdict("checked", stamp.frame_no, score)
            else:
                verdict = FrameVerdict("recovering" if refs_lost else "corrupt", stamp.frame_no, score,
                                       f"frame {stamp.frame_no}: PSNR {score:.1f} dB under {self.psnr_floor_db:g}")
            self.seen.add(stamp.frame_no)
            self.rendered_ms[stamp.frame_no] = stamp.ts_ms
        if verdict.kind == "checked":
            self.checked += 1
            assert verdict.psnr_db is not None
            self.psnrs.append(verdict.psnr_db)
            if loss_end_ms is not None and stamp is not None and stamp.ts_ms >= loss_end_ms \
                    and self.recovered_at_ms is None:
                self.recovered_at_ms = decoded_ms
        elif verdict.kind == "corrupt":
            self.corrupt += 1
            self.first_corrupt = self.first_corrupt or verdict.detail
        else:
            self.recovering += 1
        return verdict

    def missing(self) -> list[int]:
        """Frame numbers between the first and the last one decoded that never were."""
        if not self.seen:
            return []
        return [n for n in range(min(self.seen), max(self.seen) + 1) if n not in self.seen]

    def unexplained_missing(self, loss_start_ms: float | None, recovered_ms: float | None) -> int:
        """Missing frames rendered outside [loss start, recovery]: lost with no loss to explain them.

        A missing frame's render time is interpolated from its decoded neighbours' stamps.
        """
        out = 0
        known = sorted(self.rendered_ms.items())
        for n in self.missing():
            before = max((t for f, t in known if f < n), default=None)
            after = min((t for f, t in known if f > n), default=None)
            if loss_start_ms is not None and after is not None and after >= loss_start_ms and \
                    (recovered_ms is None or before is None or before <= recovered_ms):
                continue  # inside the loss window or its recovery
            out += 1
        return out

    def psnr_summary(self) -> tuple[float | None, float | None]:
        """(lowest, median) PSNR of the checked frames, dB."""
        if not self.psnrs:
            return None, None
        return round(min(self.psnrs), 2), round(statistics.median(self.psnrs), 2)
