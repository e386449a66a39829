"""Typed settings for every process of ours, loaded once in ``main()``.

A process declares one frozen dataclass whose fields are made with ``opt`` (default + help text);
``load`` builds it with the precedence command line > environment (``<PREFIX><NAME>``) > TOML file
(``--config`` / ``<PREFIX>CONFIG``, keys are the field names) > defaults.  Nothing else in a process
reads ``os.environ``.  ``settings_table`` renders the same fields as the docs' settings table, so
``--help``, the docs and the code share one source.  Pure functions, no state.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import field, fields
from pathlib import Path
from typing import Any, TypeVar


def opt(default: Any, help: str, *, argv: bool = False) -> Any:
    """A settings field with its help text; ``argv=True`` marks a command line (a string value is split
    like a shell would: ``NODE_APP_COMMAND="glxgears -fullscreen"``)."""
    meta = {"help": help, "argv": argv}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


S = TypeVar("S")


def _coerce(f: dataclasses.Field[Any], raw: Any, name: str) -> Any:
    ftype = f.type
    if isinstance(raw, str):
        if f.metadata.get("argv"):
            return shlex.split(raw)
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


def _coerce_or_exit(f: dataclasses.Field[Any], raw: Any, name: str) -> Any:
    """``_coerce``, with a one-line error instead of a traceback for a bad value (``--port abc``)."""
    try:
        return _coerce(f, raw, name)
    except ValueError as exc:
        raise SystemExit(f"{name}: bad value {raw!r}: {exc}") from None


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
            values[f.name] = _coerce_or_exit(f, env[key], key)
        cli = getattr(ns, f.name, None)
        if cli is not None:
            values[f.name] = _coerce_or_exit(f, cli, "--" + f.name.replace("_", "-"))
    return cls(**values), ns


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    factory: Any = f.default_factory
    return factory()


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    parser.add_argument("--config", help="TOML settings file (keys are the setting names)")
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = _default(f)
        help_text = f"{f.metadata.get('help', '')} [default: {default!r}]"
        if f.type in (bool, "bool"):
            parser.add_argument(flag, default=None, metavar="BOOL", help=help_text)
        else:
            parser.add_argument(flag, default=None, help=help_text)


def settings_table(cls: type[Any], env_prefix: str) -> str:
    """A Markdown table of every setting (for docs/operations.md)."""
    lines = ["| setting | env | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(cls):
        default = _default(f)
        lines.append(f"| `--{f.name.replace('_', '-')}` | `{env_prefix}{f.name.upper()}` | `{default!r}` | "
                     f"{f.metadata.get('help', '')} |")
    return "\n".join(lines)
