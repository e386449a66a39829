"""The render node's typed settings, loaded once in ``main()`` by ``rbcommon.settings.load``.

Precedence: command line > environment (``NODE_<NAME>``) > TOML file
(``--config`` / ``NODE_CONFIG``) > defaults.  Nothing else reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rbcommon import settings as common

opt = common.opt

SUBCOMMANDS = """subcommands:
  render-node encoders [--json]   probe this machine's encoders (really encodes a few frames each)
  render-node doctor [--require-gpu] [--require-gl] [--require-nvenc] [--json]
                                  what this host will do: GPUs, GL renderer, encoders and seats per GPU
  render-node selftest [--json] [--source auto|x11|pattern] [--capture B] [--seconds S] [--loss-ms MS]
                       [--encoder E] [--gpu N]
                                  paint a stamped pattern into a private Xvfb, capture, stream it to a local
                                  decoder, check every frame; exit 1 on a failure
  render-node [settings]          run the agent: register this host's GPUs and run the sessions the broker assigns
"""


@dataclass(frozen=True)
class NodeSettings:
    broker_url: str = opt("http://127.0.0.1:8080", "Broker base URL (https:// for a broker or proxy serving TLS)")
    broker_ca: str = opt("", "PEM file of the CA that signed the broker's certificate (a private CA); empty = "
                             "the system's trust store")
    node_token: str = opt("", "The broker's shared node token: it only registers the host, which is then "
                                "given a credential bound to its id")
    host_id: str = opt("", "This host's id (lowercase DNS label); empty = the machine's hostname")
    pool: str = opt("desktop", "Pool this node serves")
    address: str = opt("", "host:port shown to admins; empty = hostname")
    advertise_addresses: list[str] = opt([], "IP addresses offered as ICE host candidates (e.g. 127.0.0.1)")
    udp_ports: str = opt("", "UDP port range FIRST-LAST (e.g. 40000-40099) that viewers' media uses (ICE host "
                             "candidates), for a firewall rule or a Kubernetes hostPort range; one port per "
                             "viewer; empty = any port")
    seats: int = opt(2, "Software-encode seat budget: the seats of a host without NVML GPUs, shared among "
                          "the GPUs whose NVENC probe fails (they render on the GPU, encode on the CPU)")
    heartbeat_interval_s: float = opt(5.0, "Seconds between heartbeats (keep under a third of the lease)")
    encoder: str = opt("auto", "Encoder preference: auto, a backend (libx264, h264_nvenc) or a codec (h264, vp8)")
    capture: str = opt("auto", "Desktop capture backend: auto, x11grab or mss")
    app_command: list[str] = opt(["xterm"], argv=True, help="Command a desktop session runs on its display")
    game_renderer: str = opt("auto", "Built-in game renderer: auto (OpenGL through EGL on the session's GPU on a "
                                     "host with NVIDIA GPUs, numpy elsewhere or when GL cannot start), gl, cpu")
    game_command: list[str] = opt([], argv=True, help="Command a game session runs; empty = the built-in renderer")
    session_user: str = opt("", "Unix account (name or uid) that session programs run as: the desktop's window "
                                "manager and app, a game command, the session's sound server. Empty = the node's "
                                "own; another account needs the node to run as root")
    allow_root_sessions: bool = opt(False, "Let session programs run as root (a node run as root with no "
                                           "session_user). Off: such a node starts the built-in game only and "
                                           "fails desktop sessions, saying why")
    audio: bool = opt(True, "Sound: each desktop session gets its own PulseAudio, captured and sent as Opus; the "
                            "built-in game's sounds are synthesized in-process. False = every session is silent")
    game_beacon_ms: int = opt(0, "Benchmarks only: the built-in game beeps at every multiple of this many ms of "
                                 "its render clock (A/V sync measurement, bench/bench_avsync.py); 0 = off")
    resize_max_pixels: int = opt(2560 * 1440, "A desktop's screen follows the viewer's window up to this many pixels "
                                              "(or its start profile's, if more)")
    resize_max_side: int = opt(2560, "Longest side (px) a desktop's screen may take when it follows the viewer's "
                                     "window; Xvfb's framebuffer is this square. 0 = the screen keeps its start size")
    clipboard_primary: bool = opt(False, "Also send the desktop's PRIMARY selection (text selected with the mouse) to "
                                         "the viewer, not only CLIPBOARD")
    shutdown_grace_s: float = opt(60.0, "On SIGTERM (a rolling restart): drain this host, warn viewers, and wait up "
                                        "to this long for sessions to end before stopping; 0 stops at once. Keep "
                                        "it under the pod's terminationGracePeriodSeconds. A second SIGTERM or "
                                        "SIGINT stops at once")
    watchdog: bool = opt(True, "Drain this host when it is sick (GPU hot or throttled, VRAM leaking, sessions "
                               "failing, event loop late) and undrain it after it stays healthy")
    watchdog_max_temp_c: float = opt(90.0, "Watchdog: a GPU this hot (Celsius) drains the host")
    watchdog_max_loop_lag_ms: float = opt(1000.0, "Watchdog: the node's event loop this late (ms) drains the host")
    watchdog_healthy_hold_s: float = opt(300.0, "Watchdog: healthy this long (s) before the host takes sessions "
                                                "again; 3 trips within an hour keep it drained for an operator")
    selftest_interval_s: float = opt(3600.0, "Stream self-test: every this many seconds, when the node has no "
                                             "session, stream a stamped pattern through the encoder and WebRTC "
                                             "path to a local decoder and check every frame (with a loss window); "
                                             "a failure drains the host through the watchdog. 0 = off")
    selftest_source: str = opt("auto", "Stream self-test's frames: x11 (painted into a private Xvfb and grabbed "
                                       "with NODE_CAPTURE, as sessions are), pattern (fed straight to the "
                                       "encoder), auto (x11 where Xvfb and a capture backend are present)")
    health_host: str = opt("0.0.0.0", "Address of the node's /healthz endpoint")
    health_port: int = opt(0, "TCP port of the node's /healthz endpoint (Kubernetes probes); 0 = off")
    version: str = opt("", "Build/version this node reports at registration (an image tag, a build id); the "
                           "broker's canary rollout sends a share of sessions to hosts of a candidate version. "
                           "Empty = the installed render-broker package version")
    log_level: str = opt("info", "Logging level")

    def resolved_host_id(self) -> str:
        raw = self.host_id or socket.gethostname().split(".")[0].lower()
        return "".join(c if c.isalnum() or c in "-_" else "-" for c in raw)[:63] or "node"


def parser() -> argparse.ArgumentParser:
    """``render-node``'s argument parser: the settings, with the subcommands in the help text."""
    return argparse.ArgumentParser(
        prog="render-node", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SUBCOMMANDS,
        description="Render-node agent: registers this host's GPUs with the broker and runs the sessions it "
                    "assigns. Settings: CLI > env NODE_* > TOML file > defaults.")


def load(argv: Sequence[str] | None, env: Mapping[str, str]) -> NodeSettings:
    """Build the node's settings from CLI > env (``NODE_*``) > TOML file > defaults."""
    settings, _ = common.load(NodeSettings, argv, env, "NODE_", parser())
    return settings
