"""``render-node encoders`` / ``python -m encoder``: the probe table for this machine.

Job: probe every backend (really encoding a few frames), print one row per
backend -- available or not, why, probe time -- and the backend that would
be selected for a preference and a set of peer codecs. ``--json`` prints the
same data machine-readably.

Concurrency model: a synchronous command-line entry point; probing blocks the
calling thread, which is fine here (no event loop).

Exit status: 0 when some backend fits the preference and peer codecs, 1 when
none does, 2 on bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from encoder.backends import AIORTC_VIDEO_CODECS, BACKENDS, ProbeResult
from encoder.probe import PROBE_HEIGHT, PROBE_WIDTH, probe_all
from encoder.select import NoEncoderError, Selection, select_backend


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="render-node encoders",
        description="Probe video encoders on this machine and show which one would be used.",
    )
    parser.add_argument("--width", type=int, default=PROBE_WIDTH, help="probe width in pixels")
    parser.add_argument("--height", type=int, default=PROBE_HEIGHT, help="probe height in pixels")
    parser.add_argument(
        "--prefer", default="auto", help="auto, a backend name (libx264) or a codec (h264, vp8, hevc, av1)"
    )
    parser.add_argument(
        "--peer-codecs",
        default=",".join(sorted(AIORTC_VIDEO_CODECS)),
        help="comma-separated WebRTC codecs the peer receives (default: what aiortc sends)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _table(results: Sequence[ProbeResult]) -> str:
    by_name = {b.name: b for b in BACKENDS}
    header = ("backend", "webrtc", "kind", "status", "probe ms", "detail")
    rows = [header]
    for r in results:
        backend = by_name.get(r.name)
        rows.append(
            (
                r.name,
                backend.webrtc_codec if backend else "?",
                ("hardware" if backend.hardware else "software") if backend else "?",
                "available" if r.ok else "unavailable",
                f"{r.probe_ms:.1f}",
                r.reason,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]))
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len(header[-1]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the probe table; return the exit status."""
    args = _parser().parse_args(argv)
    # SVT-AV1 prints its banner to stderr unless told otherwise (1 = errors only).
    os.environ.setdefault("SVT_LOG", "1")
    results = probe_all(width=args.width, height=args.height)
    peers = [c.strip().upper() for c in args.peer_codecs.split(",") if c.strip()]
    selection: Selection | None = None
    error: NoEncoderError | None = None
    try:
        selection = select_backend(results, args.prefer, peers)
    except NoEncoderError as exc:
        error = exc

    if args.json:
        payload = {
            "probes": [asdict(r) for r in results],
            "selected": selection.backend.name if selection else None,
            "reasons": list(selection.reasons if selection else error.reasons if error else ()),
        }
        print(json.dumps(payload, indent=2))
    else:
        print(_table(results))
        print()
        if selection is not None:
            print(f"selected: {selection.backend.name} (prefer={args.prefer}, peer codecs={','.join(peers)})")
            for reason in selection.reasons:
                print(f"  - {reason}")
        elif error is not None:
            print(f"no encoder: {error}", file=sys.stderr)
    return 0 if selection is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
