"""``render-broker``: serve, bench, encoders hint and settings reference.

``main()`` is the only place settings are read from the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import secrets
import signal
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker.errors import ValidationError
from broker.http.edge import Edge, TlsReloader, parse_listen, tls_context
from broker.settings import BrokerSettings, load, settings_table
from rbcommon.iceurls import check_ice_urls


def _fill_secrets(s: BrokerSettings) -> tuple[BrokerSettings, list[str]]:
    generated = []
    changes = {}
    for name in ("admin_token", "node_token", "secret"):
        if not getattr(s, name):
            changes[name] = secrets.token_urlsafe(24)
            generated.append(name)
    return dataclasses.replace(s, **changes), generated


TOKEN_IN_URL = re.compile(r"(access_token=)[^&\s\"']+")


class RedactTokens(logging.Filter):
    """Replace ``access_token=...`` in every log line (access logs of SSE/WebSocket URLs) with a mark."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "access_token=" in text:
            record.msg, record.args = TOKEN_IN_URL.sub(r"\1[redacted]", text), None
        return True


class QuietBadRequests(logging.Filter):
    """A malformed HTTP request (a NUL in a header, a broken request line) is the client's error: aiohttp
    answers 400 and logs it at ERROR with a traceback; keep one warning line naming what was wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = " ".join(str(exc).split())[:200]
            record.msg, record.args, record.exc_info, record.exc_text = (
                "bad HTTP request answered %s: %s", (exc.code, detail), None, None)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="render-broker serve",
                                     description="Run the broker. Settings: CLI > env BROKER_* > TOML file > "
                                                 "defaults.")
    settings, _ = load(BrokerSettings, argv, os.environ, "BROKER_", parser)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactTokens())
    logging.getLogger("aiohttp.server").addFilter(QuietBadRequests())
    if settings.log_level.lower() != "debug":
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # heartbeats would flood the log
    settings, generated = _fill_secrets(settings)
    for name in generated:
        if name != "secret":  # the HMAC key is never printed
            print(f"generated {name}: {getattr(settings, name)}", flush=True)
    try:
        admin = Edge.from_settings(settings).admin  # bad allow-lists or admin_listen: one line, before anything starts
        for item in settings.redis_sentinels:
            parse_listen(item, "redis_sentinels")
    except ValidationError as exc:
        print(f"render-broker: {exc.detail}", file=sys.stderr)
        return 2
    try:
        check_ice_urls(settings.stun_urls, "stun_urls", ("stun", "stuns"))
        turn = check_ice_urls(settings.turn_urls, "turn_urls", ("turn", "turns"))
    except ValueError as exc:
        print(f"render-broker: {exc}", file=sys.stderr)
        return 2
    if len(turn) > 1:  # browsers try every URL; aiortc (nodes, the Python client) only the first
        logging.getLogger("broker").info("turn_urls: nodes use the first (%s); browsers try all %d",
                                         settings.turn_urls[0], len(turn))
    ctx = None
    if bool(settings.tls_cert) != bool(settings.tls_key):
        print("render-broker: tls_cert and tls_key go together (set both, or neither for plain HTTP)", file=sys.stderr)
        return 2
    if settings.tls_cert:
        try:
            ctx = tls_context(settings.tls_cert, settings.tls_key)
        except (OSError, ssl.SSLError) as exc:
            print(f"render-broker: cannot load tls_cert/tls_key: {exc}", file=sys.stderr)
            return 2
    from broker.app import create_app

    scheme = "https" if ctx else "http"
    print(f"render-broker listening on {scheme}://{settings.host}:{settings.port}/", flush=True)
    if admin:
        print(f"admin API and /metrics on {scheme}://{admin[0]}:{admin[1]}/", flush=True)
    try:
        asyncio.run(_run(create_app(settings), settings, ctx, admin))
    except OSError as exc:  # a busy port or an address this machine does not have: one line, not a traceback
        where = f"{settings.host}:{settings.port}" + (f" / {admin[0]}:{admin[1]}" if admin else "")
        print(f"render-broker: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


async def _run(app: web.Application, s: BrokerSettings, ctx: ssl.SSLContext | None,
               admin: tuple[str, int] | None) -> None:
    """Serve ``app`` on the public listener (and the admin one) until SIGINT/SIGTERM; SIGHUP reloads TLS."""
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    try:
        sites = [web.TCPSite(runner, s.host, s.port, ssl_context=ctx)]
        if admin:
            sites.append(web.TCPSite(runner, admin[0], admin[1], ssl_context=ctx))
        for site in sites:
            await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ctx is not None:
            loop.add_signal_handler(signal.SIGHUP, TlsReloader(ctx, s.tls_cert, s.tls_key).reload)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="render-broker", description=(
        "GPU render session broker.\n\ncommands:\n"
        "  serve       run the broker (render-broker serve --help lists every setting)\n"
        "  bench       allocation throughput/latency benchmark (render-broker bench --help)\n"
        "  settings    print the settings reference as a Markdown table\n"
        "  simulate    compare always-on, a scaling plan and a recommended plan (render-broker simulate --help)\n"
        "  play        stream a session into a native window (render-broker play --help; needs the play extra)\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["serve", "bench", "settings", "simulate", "play"])
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        print("\nsettings (serve):\n" + settings_table(BrokerSettings, "BROKER_"))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        return serve(rest)
    if cmd == "settings":
        print(settings_table(BrokerSettings, "BROKER_"))
        return 0
    if cmd == "simulate":
        from broker.autoscale.simulate import main as simulate_main

        return simulate_main(rest)
    if cmd == "bench":
        from broker.bench import main as bench_main

        return asyncio.run(bench_main(rest))
    if cmd == "play":
        try:  # the client and pygame load only here: the broker itself never imports them
            from rbclient.play import main as play_main
        except ModuleNotFoundError as exc:
            if exc.name != "pygame":
                raise
            print("render-broker play needs pygame: pip install 'render-broker[play]'", file=sys.stderr)
            return 2
        return play_main(rest)
    parser.error(f"unknown command {cmd!r}")
    return 2
