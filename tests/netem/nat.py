"""A real NAT topology for TURN tests: the viewer on a home LAN behind a masquerading router, coturn
on a private address behind a 1:1 NAT (a cloud "elastic IP"), the render node on a public address,
and no path between node and viewer but the TURN server.

Topology (one namespace per role, ``rbn<pid>x<n>-<role>``; addresses are documentation ranges)::

    viewer (home LAN)       home (NAT router)              core ("the internet")
    eth0 192.168.7.2 --- lan 192.168.7.1 | wan 192.0.2.2 --- home 192.0.2.1
                                                           node 198.51.100.1 --- node: eth0 198.51.100.2
    turn                     edge (1:1 NAT)                 |
    eth0 10.77.0.10 ------ dc 10.77.0.1 | wan 203.0.113.2 --- edge 203.0.113.1
                                         (+ 203.0.113.10, the TURN server's public address)

- home: ``masquerade`` out of ``wan`` and a stateful firewall (nothing unsolicited comes in), as a
  home router does; the viewer's packets reach the internet from 192.0.2.2.
- edge: ``dnat`` of 203.0.113.10 to 10.77.0.10 and ``snat`` of 10.77.0.10 back to it, so coturn,
  which only knows its private address, is reached at the public one; started with
  ``--external-ip 203.0.113.10/10.77.0.10`` it hands out relay addresses on the public one.
- core: routes the three public networks (no route to either private one) and drops everything
  between the home network and the node's: node and viewer cannot reach each other directly.
  Services every side reaches (the broker) run here, at ``CORE_VIEWER_IP`` / ``CORE_NODE_IP``.
Every translating or dropping rule is in table ``ip rbnat`` of its namespace with a counter named by
its comment (``counter(side, comment)``).  NAT rules count connections (only a connection's first
packet meets them); the edge's ``viewer to turn`` and ``turn to viewer`` count every packet between
coturn's private address and the home router's public one (the path through both NATs).  Built in
the constructor; ``close()`` (or the context manager) kills every process started by ``popen`` and
deletes the namespaces (``lab.Netns``).
"""

from __future__ import annotations

from tests.netem.lab import Netns, _run

VIEWER_IP = "192.168.7.2"
HOME_LAN_IP = "192.168.7.1"
HOME_WAN_IP = "192.0.2.2"  # the viewer's address as the internet sees it
CORE_VIEWER_IP = "192.0.2.1"  # the core (broker) as the viewer reaches it
CORE_NODE_IP = "198.51.100.1"  # ... and as the node reaches it
CORE_EDGE_IP = "203.0.113.1"
EDGE_WAN_IP = "203.0.113.2"
TURN_PUBLIC_IP = "203.0.113.10"
EDGE_DC_IP = "10.77.0.1"
TURN_PRIVATE_IP = "10.77.0.10"
NODE_IP = "198.51.100.2"
EXTERNAL_IP = f"{TURN_PUBLIC_IP}/{TURN_PRIVATE_IP}"  # coturn's --external-ip (public/private)
TABLE = "rbnat"
ROLES = ("viewer", "home", "core", "edge", "turn", "node")
ROUTERS = ("home", "core", "edge")

_HOME_RULES = f"""table ip {TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" counter masquerade comment "masquerade"
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" counter drop comment "unsolicited"
  }}
}}
"""
_EDGE_RULES = f"""table ip {TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {TURN_PUBLIC_IP} counter dnat to {TURN_PRIVATE_IP} comment "dnat"
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {TURN_PRIVATE_IP} oifname "wan" counter snat to {TURN_PUBLIC_IP} comment "snat"
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ip saddr {HOME_WAN_IP} ip daddr {TURN_PRIVATE_IP} counter comment "viewer to turn"
    ip saddr {TURN_PRIVATE_IP} ip daddr {HOME_WAN_IP} counter comment "turn to viewer"
  }}
}}
"""
_CORE_RULES = f"""table ip {TABLE} {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "home" oifname "node" counter drop comment "viewer to node"
    iifname "node" oifname "home" counter drop comment "node to viewer"
  }}
}}
"""


class NatLab(Netns):
    """The topology above; ``popen(role, argv)`` runs a process in a role's namespace
    (``viewer``, ``home``, ``core``, ``edge``, ``turn``, ``node``)."""

    def __init__(self) -> None:
        super().__init__(ROLES, routers=ROUTERS)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        ns = self.namespaces
        # every veth is made inside one namespace with its peer placed straight in the other
        links = [("core", "home", "home", "wan"), ("core", "edge", "edge", "wan"), ("core", "node", "node", "eth0"),
                 ("home", "lan", "viewer", "eth0"), ("edge", "dc", "turn", "eth0")]
        for a, a_if, b, b_if in links:
            _run(["ip", "-n", ns[a], "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", ns[b]])
        layout = {  # role: ([(interface, address/prefix)], default gateway)
            "viewer": ([("eth0", f"{VIEWER_IP}/24")], HOME_LAN_IP),
            "home": ([("lan", f"{HOME_LAN_IP}/24"), ("wan", f"{HOME_WAN_IP}/24")], CORE_VIEWER_IP),
            "core": ([("home", f"{CORE_VIEWER_IP}/24"), ("edge", f"{CORE_EDGE_IP}/24"), ("node", f"{CORE_NODE_IP}/24")],
                     None),
            "edge": ([("wan", f"{EDGE_WAN_IP}/24"), ("wan", f"{TURN_PUBLIC_IP}/32"), ("dc", f"{EDGE_DC_IP}/24")],
                     CORE_EDGE_IP),
            "turn": ([("eth0", f"{TURN_PRIVATE_IP}/24")], EDGE_DC_IP),
            "node": ([("eth0", f"{NODE_IP}/24")], CORE_NODE_IP),
        }
        for role, (addrs, gateway) in layout.items():
            batch = "link set lo up\n" + "".join(f"addr add {a} dev {dev}\n" for dev, a in addrs)
            batch += "".join(f"link set {dev} up\n" for dev in dict.fromkeys(dev for dev, _a in addrs))
            if gateway:
                batch += f"route add default via {gateway}\n"
            _run(["ip", "-n", ns[role], "-batch", "-"], stdin=batch)
        self.nft("home", _HOME_RULES)
        self.nft("edge", _EDGE_RULES)
        self.nft("core", _CORE_RULES)

    def counter(self, side: str, comment: str) -> int:
        """Packets counted so far by the ``rbnat`` rule of ``side`` named ``comment``."""
        return self.nft_counter(side, TABLE, comment)
