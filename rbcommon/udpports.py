"""ICE host candidates on UDP ports from a configured range (a firewall rule, a Kubernetes hostPort range).

Job: aioice binds every host candidate on port 0 (any port the kernel picks), so a node behind a
firewall that opens only a range, or a pod that publishes a range of host ports, cannot be reached.
``PortRange.parse`` reads the node's ``udp_ports`` setting (``"40000-40099"``); ``gather_in_range``
gathers a connection's candidates the way aioice does, except that each host socket is bound to a
free port of the range: tried from a random offset (concurrent sessions do not race for the first
port), skipping ports in use, and ``NoFreePort`` when every port of the range is taken on that address.
Server-reflexive candidates are asked over those same sockets, and a TURN relay is gathered by
aioice itself (its socket talks to the TURN server only, so its local port does not matter).

Uses aioice 0.13 internals (``StunProtocol``, ``server_reflexive_candidate``, ``Connection._protocols``),
the same ones its own gathering uses; ``tests/streamer/media/test_udpports.py`` breaks if they move.

Concurrency model: coroutines on the event loop that owns the connection.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import random
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aioice import turn
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import Connection, StunProtocol, server_reflexive_candidate

MIN_PORT: Final = 1024  # below: privileged, and every well-known service
MAX_PORT: Final = 65535
_SKIPPED_ERRNOS: Final = frozenset({errno.EADDRINUSE, errno.EACCES})


class NoFreePort(OSError):
    """Every port of the range is in use on an address."""


@dataclass(frozen=True, slots=True)
class PortRange:
    """UDP ports ``first..last`` (inclusive)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not MIN_PORT <= self.first <= self.last <= MAX_PORT:
            raise ValueError(f"udp_ports {self.first}-{self.last}: want FIRST-LAST within {MIN_PORT}-{MAX_PORT}, "
                             "FIRST <= LAST")

    @classmethod
    def parse(cls, text: str) -> PortRange | None:
        """``"40000-40099"`` (or one port, ``"40000"``); ``""`` = no range (the kernel picks). ValueError naming
        the setting otherwise."""
        text = text.strip()
        if not text:
            return None
        first, sep, last = text.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise ValueError(f"udp_ports {text!r}: want FIRST-LAST, e.g. 40000-40099") from None
        return cls(lo, hi)

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def order(self, rng: random.Random) -> list[int]:
        """Every port once, from a random offset, wrapping around."""
        start = rng.randrange(len(self))
        return [self.first + (start + i) % len(self) for i in range(len(self))]


async def bind_in_range(
    factory: Callable[[], asyncio.DatagramProtocol], address: str, ports: PortRange, rng: random.Random | None = None
) -> tuple[asyncio.DatagramTransport, asyncio.DatagramProtocol]:
    """A datagram endpoint on ``address`` and the first free port of ``ports`` (in ``PortRange.order``)."""
    loop = asyncio.get_running_loop()
    for port in ports.order(rng or random.Random()):
        try:
            return await loop.create_datagram_endpoint(factory, local_addr=(address, port))
        except OSError as exc:
            if exc.errno not in _SKIPPED_ERRNOS:
                raise
    raise NoFreePort(errno.EADDRINUSE, f"no free UDP port in {ports} on {address}")


async def gather_in_range(
    conn: Connection,
    component: int,
    addresses: Sequence[str],
    ports: PortRange,
    timeout: float,  # noqa: ASYNC109  # aioice's own gathering takes one
    relay_only_gather: Callable[[], Coroutine[Any, Any, list[Candidate]]],
) -> list[Candidate]:
    """``conn``'s candidates for ``component``: host candidates on ``addresses`` within ``ports``, their
    server-reflexive twins (IPv4, when ``conn`` has a STUN server), and whatever ``relay_only_gather`` (aioice's
    own gathering on no host address: the TURN relay) returns.  ``NoFreePort`` when an address has no free port."""
    candidates: list[Candidate] = []
    protocols: list[StunProtocol] = []
    try:
        for address in addresses:
            transport, proto = await bind_in_range(lambda: StunProtocol(conn), address, ports)
            protocol = proto if isinstance(proto, StunProtocol) else None
            assert protocol is not None
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, turn.UDP_SOCKET_BUFFER_SIZE)
            host, port = transport.get_extra_info("sockname")[:2]
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", host), component=component, transport="udp",
                priority=candidate_priority(component, "host"), host=host, port=port, type="host",
            )
            protocols.append(protocol)
            candidates.append(protocol.local_candidate)
    except BaseException:
        for protocol in protocols:
            protocol.transport.close()
        raise
    conn._protocols += protocols  # how aioice pairs and reads its sockets
    tasks: list[asyncio.Task[Any]] = []
    stun_server = conn.stun_server
    if stun_server:
        tasks += [asyncio.create_task(server_reflexive_candidate(p, stun_server)) for p in protocols
                  if ipaddress.ip_address(p.local_candidate.host).version == 4]
    relay: asyncio.Task[list[Candidate]] = asyncio.create_task(relay_only_gather())
    done, pending = await asyncio.wait([*tasks, relay], timeout=timeout)
    for task in pending:
        task.cancel()
    for task in tasks:
        if task in done and task.exception() is None:
            candidates.append(task.result()[0])
    if relay in done and relay.exception() is None:
        candidates += relay.result()
    return candidates
