"""Container HEALTHCHECK for both images: exit 0 when the process answers its probe URL with 2xx.

    python healthcheck.py broker   GET /readyz on BROKER_PORT (https when BROKER_TLS_CERT is set)
    python healthcheck.py node     GET /healthz on NODE_HEALTH_PORT

Standard library only (the slim image has no curl).  Reads the same environment variables the
process reads, so a changed port or TLS setting needs no second edit.  Exit 1 with the reason on
stderr otherwise (``docker inspect`` shows it).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 4.0  # under the HEALTHCHECK --timeout of the Dockerfiles


def probe_url(role: str, env: dict[str, str]) -> str:
    if role == "broker":
        scheme = "https" if env.get("BROKER_TLS_CERT") else "http"
        return f"{scheme}://127.0.0.1:{env.get('BROKER_PORT') or '8080'}/readyz"
    if role == "node":
        return f"http://127.0.0.1:{env.get('NODE_HEALTH_PORT') or '8090'}/healthz"
    raise SystemExit(f"usage: healthcheck.py broker|node (not {role!r})")


def main(argv: list[str]) -> int:
    url = probe_url(argv[1] if len(argv) > 1 else "", dict(os.environ))
    ctx = ssl._create_unverified_context() if url.startswith("https") else None  # loopback, own cert
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=ctx) as resp:
            return 0 if 200 <= resp.status < 300 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
