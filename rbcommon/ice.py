"""Host ICE candidates on chosen addresses, for any aiortc peer (the render node's and the client SDK's).

Job: aioice 0.13 gathers host candidates on every interface address except 127.0.0.1 and has
no option to choose; on a loopback-only host nothing connects and nothing is raised, and an
operator may want to offer one address of a multi-homed machine.  ``advertise_host_addresses``
re-classes each ICE gatherer's aioice ``Connection`` of an ``RTCPeerConnection`` as
``AdvertisingConnection``, which overrides aioice's public ``get_component_candidates`` to bind
the given addresses.  Reaching the gatherer's connection (``RTCIceGatherer._connection``) is
the one private attribute read.

Concurrency: none of its own; call it on the event loop before ``setLocalDescription``.
Invariant: with addresses given, the host candidates are exactly those addresses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from aioice import Connection
from aioice.candidate import Candidate
from aiortc import RTCPeerConnection
from aiortc.rtcicetransport import RTCIceGatherer

from rbcommon.udpports import PortRange, gather_in_range

__all__ = ["AdvertisingConnection", "advertise_host_addresses"]


class AdvertisingConnection(Connection):
    """An aioice ``Connection`` that binds host candidates on configured addresses only.

    aioice 0.13 gathers on every interface address except 127.0.0.1 and has no
    option to choose; a node on a loopback-only host, or one that must offer a
    particular address, needs exactly the addresses it is told.
    """

    advertise_addresses: tuple[str, ...] = ()
    udp_ports: PortRange | None = None  # host candidates bind within this range (rbcommon.udpports)

    async def get_component_candidates(
        self,
        component: int,
        addresses: list[str],
        timeout: int = 5,  # noqa: ASYNC109  # aioice's signature
    ) -> list[Candidate]:
        """aioice's own gathering, on ``advertise_addresses`` (else the interface list aioice passes) and,
        with ``udp_ports``, on ports of that range."""
        wanted = list(self.advertise_addresses) or addresses
        if self.udp_ports is None:
            return await super().get_component_candidates(component=component, addresses=wanted, timeout=timeout)
        gather_relay = super().get_component_candidates
        return await gather_in_range(self, component, wanted, self.udp_ports, timeout,
                                     lambda: gather_relay(component=component, addresses=[], timeout=timeout))


def _ice_gatherers(pc: RTCPeerConnection) -> list[RTCIceGatherer]:
    gatherers: dict[int, RTCIceGatherer] = {}
    for transceiver in pc.getTransceivers():
        gatherer = transceiver.receiver.transport.transport.iceGatherer
        gatherers[id(gatherer)] = gatherer
    if pc.sctp is not None:
        gatherer = pc.sctp.transport.transport.iceGatherer
        gatherers[id(gatherer)] = gatherer
    return list(gatherers.values())


def advertise_host_addresses(pc: RTCPeerConnection, addresses: Sequence[str],
                             udp_ports: PortRange | None = None) -> int:
    """Make ``pc`` offer host candidates on exactly ``addresses`` (e.g. ``("127.0.0.1",)``).

    Why: aioice skips 127.0.0.1 when gathering, so on a loopback-only host
    nothing connects and nothing is raised; and an operator may want to offer
    one address of a multi-homed node.  Call it after the transceivers (and
    data channel) exist and before ``setLocalDescription`` (which gathers);
    for an answerer, after ``setRemoteDescription`` (which creates and
    bundles transports).  An empty ``addresses`` leaves aioice's interface list.
    ``udp_ports``: host candidates bind within that range (a firewall's, a hostPort range).
    Returns the number of ICE gatherers adjusted (0: aioice's default gathering).  Raises ``RuntimeError``
    if a gatherer has already gathered.
    """
    if not addresses and udp_ports is None:
        return 0
    wanted = tuple(dict.fromkeys(addresses))
    gatherers = _ice_gatherers(pc)
    for gatherer in gatherers:
        if gatherer.state != "new":
            raise RuntimeError(f"ICE gatherer already {gatherer.state}: advertise before setLocalDescription")
        connection = gatherer._connection  # the one private attribute: aiortc offers no other way in
        if type(connection) is not Connection and not isinstance(connection, AdvertisingConnection):
            raise TypeError(f"unexpected ICE connection type {type(connection).__name__}")
        connection.__class__ = AdvertisingConnection
        cast(AdvertisingConnection, connection).advertise_addresses = wanted
        cast(AdvertisingConnection, connection).udp_ports = udp_ports
    return len(gatherers)
