"""The render node's typed settings, loaded once in ``main()``.

Precedence: command line > environment (``NODE_<NAME>``) > TOML file
(``--config`` / ``NODE_CONFIG``) > defaults.  Nothing else reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def opt(default: Any, help: str) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class NodeSettings:
    broker_url: str = opt("http://127.0.0.1:8080", "Broker base URL")
    node_token: str = opt("", "Bearer token for node endpoints (the broker's node token)")
    host_id: str = opt("", "This host's id (lowercase DNS label); empty = the machine's hostname")
    pool: str = opt("desktop", "Pool this node serves")
    address: str = opt("", "host:port shown to admins; empty = hostname")
    advertise_addresses: list[str] = opt([], "IP addresses offered as ICE host candidates (e.g. 127.0.0.1)")
    seats: int = opt(2, "Sessions this host runs when it has no NVML GPU (CPU-encode host)")
    heartbeat_interval_s: float = opt(5.0, "Seconds between heartbeats (keep under a third of the lease)")
    encoder: str = opt("auto", "Encoder preference: auto, a backend (libx264, h264_nvenc) or a codec (h264, vp8)")
    capture: str = opt("auto", "Desktop capture backend: auto, x11grab or mss")
    app_command: list[str] = opt(["xterm"], "Command a desktop session runs on its display")
    game_command: list[str] = opt([], "Command a game session runs; empty = the built-in renderer")
    log_level: str = opt("info", "Logging level")

    def resolved_host_id(self) -> str:
        raw = self.host_id or socket.gethostname().split(".")[0].lower()
        return "".join(c if c.isalnum() or c in "-_" else "-" for c in raw)[:63] or "node"


def _coerce(f: dataclasses.Field[Any], raw: str) -> Any:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if t == "int":
        return int(raw)
    if t == "float":
        return float(raw)
    if f.name.endswith("_command"):
        return shlex.split(raw)
    if t.startswith("list"):
        return [p for p in (x.strip() for x in raw.split(",")) if p]
    return raw


def load(argv: Sequence[str] | None, env: Mapping[str, str]) -> NodeSettings:
    parser = argparse.ArgumentParser(prog="render-node", description="Render-node agent: registers this host's "
                                     "GPUs with the broker and runs the sessions it assigns. Settings: CLI > env "
                                     "NODE_* > TOML file > defaults.")
    parser.add_argument("--config", help="TOML settings file")
    for f in fields(NodeSettings):
        parser.add_argument("--" + f.name.replace("_", "-"), default=None,
                            help=f"{f.metadata['help']} [env NODE_{f.name.upper()}]")
    ns = parser.parse_args(argv)
    values: dict[str, Any] = {}
    cfg = ns.config or env.get("NODE_CONFIG")
    if cfg:
        values.update(tomllib.loads(Path(cfg).read_text()))
    for f in fields(NodeSettings):
        if f"NODE_{f.name.upper()}" in env:
            values[f.name] = _coerce(f, env[f"NODE_{f.name.upper()}"])
        cli = getattr(ns, f.name)
        if cli is not None:
            values[f.name] = _coerce(f, cli)
    return NodeSettings(**values)
