"""Network-emulation lab: a node and a viewer namespace joined through a router namespace.

Job: give tests and benchmarks a real IP path whose rate, queue, loss, delay and jitter can be
set per direction and changed live, on a kernel without netem.

Topology (names unique per Lab: ``rbn<pid>x<n>-node`` / ``-router`` / ``-viewer``)::

    node ns                 router ns                         viewer ns
    eth0 10.231.1.2 ---- rnode 10.231.1.1 | rviewer 10.231.2.1 ---- eth0 10.231.2.2

Per direction, in the router (downlink = node -> viewer enters on ``rnode`` and leaves on
``rviewer``; uplink the reverse), in packet order:
  1. loss: nftables forward chain (priority -200), ``numgen random mod 10000 < N drop``
     with named counters of packets seen and dropped;
  2. delay/jitter: ``iptables -t mangle -A FORWARD -i <ingress> -j NFQUEUE`` (priority
     -150; queue 0 down, 1 up; nft's own ``queue`` statement is missing from this kernel)
     hands every packet to ``delayq.py``, a user-space emulator run in the router that gives
     the verdict after the delay.  It is installed always: 0 ms means an immediate verdict;
  3. rate: htb (one class 1:1) on the egress interface with a bfifo leaf whose limit is
     ``queue_ms`` at the rate (drop-tail beyond).  Shaping sits in the router, not on the
     sender's own interface, so a full queue drops packets instead of blocking the socket.
IPv6 is disabled in all three namespaces so no router solicitations or MLD share the path.

Concurrency model: synchronous.  Every change runs ``tc``/``nft`` to completion and waits for
the emulator's acknowledgement, so a setter returns only when the new condition is in force
for the next packet.  Public methods serialize on one lock, so a thread running ``play`` (a
scripted scenario of timed ``Step``s) may change conditions while another reads ``counters``.

Invariants: nothing is changed in the root namespace except adding and deleting our three
namespaces (veths are created directly inside them; rules and qdiscs live inside them).
``close()`` is idempotent: it kills the process groups started by ``popen``, the emulator and
anything left inside the namespaces, then deletes the namespaces.  Labs still open at
interpreter exit are closed by an atexit hook; namespaces left by dead processes (same prefix,
pid no longer alive) are swept when a Lab starts.  ``Netns`` (namespaces, processes, nft rules and
teardown) is the part shared with other topologies (``nat.py``).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Self

from rbcommon.procs import pid_alive

NS_PREFIX = "rbn"
NODE_IP = "10.231.1.2"
ROUTER_NODE_IP = "10.231.1.1"
VIEWER_IP = "10.231.2.2"
ROUTER_VIEWER_IP = "10.231.2.1"
R_NODE_IF = "rnode"  # router's interface toward the node (uplink egress)
R_VIEWER_IF = "rviewer"  # router's interface toward the viewer (downlink egress)
END_IF = "eth0"  # the single interface of the node and viewer namespaces

NFT_TABLE = "rbnetem"
QUEUE_NUM = {"down": 0, "up": 1}  # NFQUEUE numbers (per namespace, so fixed)
INGRESS_IF = {"down": R_NODE_IF, "up": R_VIEWER_IF}  # where each direction enters the router
EGRESS_IF = {"down": R_VIEWER_IF, "up": R_NODE_IF}  # where it is shaped

UNLIMITED_RATE_BPS = 10_000_000_000  # htb rate standing for "no limit", bit/s
UNLIMITED_QUEUE_BYTES = 4_000_000  # bfifo limit when there is no rate limit, bytes
MIN_QUEUE_BYTES = 3_000  # a bfifo must hold at least two full-size packets, bytes
LOSS_MODULUS = 10_000  # numgen modulus: loss resolution 0.01 %
CMD_TIMEOUT_S = 10.0  # any single ip/tc/nft command
EMULATOR_TIMEOUT_S = 10.0  # emulator start and acknowledgement
KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL grace per process group

DELAYQ_PATH = Path(__file__).with_name("delayq.py")
_NS_RE = re.compile(rf"^{NS_PREFIX}(\d+)x(\d+)-([a-z]+)\b")  # <prefix><pid>x<n>-<role>

Side = Literal["node", "viewer", "router"]  # the Lab's namespace roles


class LabError(RuntimeError):
    """A command building or changing the lab failed; the message carries its stderr."""


@dataclass(frozen=True)
class Link:
    """Conditions on one direction of the path.

    ``rate_bps`` is enforced by htb on Ethernet frames (IP length + 14 bytes), so 1228-byte IP
    packets through a 4 Mbit/s link carry ~3.95 Mbit/s of IP.  Without reordering (the Lab's
    default) a packet leaves no earlier than the one before it, so when packets are spaced much
    closer than ``jitter_ms`` most of them leave near ``delay_ms + jitter_ms``: the spread
    shrinks and the mean rises, as with queueing jitter on a real path.
    """

    rate_bps: int | None = None  # bottleneck rate, bit/s; None: unlimited
    delay_ms: float = 0.0  # one-way added delay, ms
    jitter_ms: float = 0.0  # uniform +- around delay_ms, ms (clamped so delay never < 0)
    loss_percent: float = 0.0  # random drop, 0-100 %, resolution 0.01 %
    queue_ms: int = 100  # bottleneck buffer, ms at rate_bps (drop-tail beyond)

    def __post_init__(self) -> None:
        if self.rate_bps is not None and self.rate_bps <= 0:
            raise ValueError(f"rate_bps must be > 0 or None, got {self.rate_bps}")
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError("delay_ms and jitter_ms must be >= 0")
        if not 0.0 <= self.loss_percent <= 100.0:
            raise ValueError(f"loss_percent must be within 0-100, got {self.loss_percent}")
        if self.queue_ms <= 0:
            raise ValueError(f"queue_ms must be > 0, got {self.queue_ms}")

    def queue_limit_bytes(self) -> int:
        """The bfifo limit, bytes: queue_ms worth of rate_bps, at least two full packets."""
        if self.rate_bps is None:
            return UNLIMITED_QUEUE_BYTES
        return max(self.rate_bps * self.queue_ms // 8_000, MIN_QUEUE_BYTES)

    def loss_threshold(self) -> int:
        """N in ``numgen random mod LOSS_MODULUS < N``."""
        return round(self.loss_percent * LOSS_MODULUS / 100.0)


@dataclass(frozen=True)
class Step:
    """One change of a scripted scenario, ``at_s`` seconds after ``Lab.play`` starts."""

    at_s: float  # offset from the start of the scenario, s
    downlink: Link | None = None  # None: leave that direction as it is
    uplink: Link | None = None


def _iptables_nfqueue(in_if: str, queue_num: int) -> list[str]:
    """iptables argv appending the rule that queues packets arriving on ``in_if`` to ``queue_num``."""
    return ["iptables", "-w", "-t", "mangle", "-A", "FORWARD", "-i", in_if, "-j", "NFQUEUE", f"--queue-num={queue_num}"]


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@functools.cache
def unavailable_reason() -> str | None:
    """Why a Lab cannot be made here, or None if it can (probed once per process)."""
    if os.geteuid() != 0:
        return "network namespaces need root (euid is not 0)"
    for tool in ("ip", "tc", "nft", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: iproute2 / nftables / iptables)"
    try:
        import netfilterqueue  # noqa: F401
    except ImportError as exc:
        return f"NetfilterQueue is not importable ({exc}); run scripts/setup.sh"
    probe = f"{NS_PREFIX}{os.getpid()}x0-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        _run(["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "handle", "1:", "htb", "default", "1"])
        nft = (
            "table inet probe {\n chain f {\n  type filter hook forward priority -200; policy accept;\n"
            '  iifname "p0" numgen random mod 10000 < 1 drop\n }\n}\n'
        )
        _run(["ip", "netns", "exec", probe, "nft", "-f", "-"], stdin=nft)
        # nftables' own `queue` statement is missing from this kind of kernel (nft_queue):
        # the xtables NFQUEUE target, through iptables, is what feeds the emulator.
        _run(["ip", "netns", "exec", probe, *_iptables_nfqueue("p0", 0)])
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        return f"namespaces work but veth/htb/nftables numgen+queue do not: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _kill_netns_pids(ns: str) -> None:
    for pid_s in _run(["ip", "netns", "pids", ns], check=False).split():
        try:
            os.kill(int(pid_s), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def sweep_stale_namespaces() -> list[str]:
    """Delete namespaces with our prefix whose creating pid is dead; return their names."""
    swept = []
    for ns in _netns_names():
        m = _NS_RE.match(ns)
        if m and not pid_alive(int(m.group(1))):
            _kill_netns_pids(ns)
            _run(["ip", "netns", "del", ns], check=False)
            swept.append(ns)
    return swept


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL it after a grace period.

    Signals go to the group only while its leader is unreaped (so its pid, the group id, cannot
    have been reused); stragglers of a group whose leader already exited are killed by the
    namespace sweep in ``Lab.close``.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass


class _Emulator:
    """The delayq.py process in the router namespace and its JSON-lines control pipe."""

    def __init__(self, router_ns: str, reorder: bool) -> None:
        argv = ["ip", "netns", "exec", router_ns, sys.executable, str(DELAYQ_PATH)]
        argv += [f"--queue={d}={n}" for d, n in QUEUE_NUM.items()]
        if reorder:
            argv.append("--reorder")
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._out_fd = self.proc.stdout.fileno()
        self._buf = b""
        self._next_id = itertools.count(1)
        first = self._read_line(EMULATOR_TIMEOUT_S)
        if not first.get("ready"):
            raise LabError(f"delay emulator did not start: {first}")

    def _stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()[-2000:]

    def _read_line(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self._out_fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left_s = deadline - time.monotonic()
                if left_s <= 0 or not sel.select(left_s):
                    raise LabError(f"delay emulator timed out; stderr: {self._stderr_text()}")
                chunk = os.read(self._out_fd, 65536)
                if not chunk:
                    raise LabError(f"delay emulator exited ({self.proc.poll()}); stderr: {self._stderr_text()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send one command and wait for its acknowledgement."""
        assert self.proc.stdin is not None
        msg_id = next(self._next_id)
        try:
            self.proc.stdin.write((json.dumps({**msg, "id": msg_id}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise LabError(f"delay emulator is gone; stderr: {self._stderr_text()}") from exc
        reply = self._read_line(EMULATOR_TIMEOUT_S)
        if reply.get("id") != msg_id or not reply.get("ok"):
            raise LabError(f"delay emulator refused {msg}: {reply}")
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # EOF: the emulator unbinds its queues and exits
            except OSError:
                pass
        try:
            self.proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


_open_labs: set[Netns] = set()  # strong references: a lab dropped unclosed is still closed at exit
_counter = itertools.count(1)


@atexit.register
def _close_open_labs() -> None:
    for lab in list(_open_labs):
        lab.close()


class Netns:
    """Network namespaces made for one test, one per role (``rbn<pid>x<n>-<role>``), and the
    processes started in them; subclasses join them with links and rules.

    IPv6 is off in each (no router solicitations or MLD on the path); the ``routers`` forward IPv4.
    ``close()`` is idempotent: it kills the process groups started by ``popen`` (the last started
    first, so a server, e.g. the broker, is not left waiting on its clients' connections), anything
    else left inside the namespaces, then deletes them (also at interpreter exit).  ``_lock`` serializes
    ``popen``, ``nft`` and ``close`` (subclasses take it for their own changes too).
    """

    def __init__(self, roles: Sequence[str], routers: Sequence[str] = ()) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise LabError(f"network lab unavailable: {reason}")
        sweep_stale_namespaces()
        base = f"{NS_PREFIX}{os.getpid()}x{next(_counter)}"
        self.namespaces = {role: f"{base}-{role}" for role in roles}
        self._created: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._lock = threading.Lock()
        _open_labs.add(self)
        try:
            for role, ns in self.namespaces.items():
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
                sysctls = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
                if role in routers:
                    sysctls.append("net.ipv4.ip_forward=1")
                self._ns_sh(ns, ["sysctl", "-q", "-w", *sysctls])
        except BaseException:
            self.close()
            raise

    def _ns_sh(self, ns: str, argv: Sequence[str], stdin: str | None = None) -> str:
        return _run(["ip", "netns", "exec", ns, *argv], stdin=stdin)

    def popen(self, side: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace of role ``side``, in its own process group.

        ``kwargs`` go to ``subprocess.Popen``.  The process group is killed by ``close()``.
        """
        ns = self.namespaces[side]
        kwargs.setdefault("start_new_session", True)
        with self._lock:
            if self._closed:
                raise LabError("lab is closed")
            proc: subprocess.Popen[Any] = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kwargs)
            self._procs.append(proc)
        return proc

    def nft(self, side: str, ruleset: str) -> None:
        """Load nftables rules in the namespace of role ``side``; they go with it on ``close()``."""
        with self._lock:
            if self._closed:
                raise LabError("lab is closed")
            self._ns_sh(self.namespaces[side], ["nft", "-f", "-"], stdin=ruleset)

    def nft_counter(self, side: str, table: str, comment: str) -> int:
        """Packets counted by the rule of ``table`` (family inet or ip) in role ``side`` whose
        comment is ``comment``; LabError if there is no such rule."""
        out = json.loads(self._ns_sh(self.namespaces[side], ["nft", "-j", "list", "ruleset"]))
        for item in out.get("nftables", []):
            rule = item.get("rule")
            if rule and rule["table"] == table and rule.get("comment") == comment:
                for expr in rule["expr"]:
                    if "counter" in expr:
                        return int(expr["counter"]["packets"])
        raise LabError(f"no counted rule {comment!r} in table {table} of {side}")

    def _stop_helpers(self) -> None:
        """Subclass hook: stop what the subclass started itself, after ``popen``'s processes."""

    def close(self) -> None:
        """Kill every process we started and delete the namespaces; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for proc in reversed(self._procs):  # last started first: a client goes before its server
            _kill_group(proc)
        self._stop_helpers()
        for ns in self._created:
            _kill_netns_pids(ns)
        for ns in self._created:
            _run(["ip", "netns", "del", ns], check=False)
        _open_labs.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lab(Netns):
    """Three namespaces (node, router, viewer) with per-direction emulated conditions.

    Built in the constructor; use as a context manager or call ``close()``.
    ``downlink`` is node -> viewer, ``uplink`` viewer -> node.  ``reorder=True`` lets jitter
    reorder packets (by default it never does).
    """

    def __init__(self, downlink: Link = Link(), uplink: Link = Link(), *, reorder: bool = False) -> None:
        self._emulator: _Emulator | None = None
        self._links: dict[str, Link] = {}
        super().__init__(("node", "router", "viewer"), routers=("router",))
        self.node_ns = self.namespaces["node"]
        self.router_ns = self.namespaces["router"]
        self.viewer_ns = self.namespaces["viewer"]
        self.node_ip = NODE_IP
        self.viewer_ip = VIEWER_IP
        try:
            self._build()
            self._emulator = _Emulator(self.router_ns, reorder)
            self._install_rules()
            self.set_downlink(downlink)
            self.set_uplink(uplink)
        except BaseException:
            self.close()
            raise

    # -- building -------------------------------------------------------------------------

    def _build(self) -> None:
        # Veths are created inside the router with their peer placed straight in the end
        # namespace: no interface ever exists in the root namespace.
        router_batch = f"""\
link set lo up
link add {R_NODE_IF} type veth peer name {END_IF} netns {self.node_ns}
link add {R_VIEWER_IF} type veth peer name {END_IF} netns {self.viewer_ns}
addr add {ROUTER_NODE_IP}/24 dev {R_NODE_IF}
addr add {ROUTER_VIEWER_IP}/24 dev {R_VIEWER_IF}
link set {R_NODE_IF} up
link set {R_VIEWER_IF} up
"""
        _run(["ip", "-n", self.router_ns, "-batch", "-"], stdin=router_batch)
        for ns, ip, gw in ((self.node_ns, NODE_IP, ROUTER_NODE_IP), (self.viewer_ns, VIEWER_IP, ROUTER_VIEWER_IP)):
            batch = f"link set lo up\naddr add {ip}/24 dev {END_IF}\nlink set {END_IF} up\nroute add default via {gw}\n"
            _run(["ip", "-n", ns, "-batch", "-"], stdin=batch)
        tc_batch = "".join(
            f"qdisc add dev {dev} root handle 1: htb default 1\n"
            f"class add dev {dev} parent 1: classid 1:1 htb rate {UNLIMITED_RATE_BPS}bit quantum 1514\n"
            f"qdisc add dev {dev} parent 1:1 handle 10: bfifo limit {UNLIMITED_QUEUE_BYTES}\n"
            for dev in (R_NODE_IF, R_VIEWER_IF)
        )
        _run(["tc", "-n", self.router_ns, "-batch", "-"], stdin=tc_batch)

    def _install_rules(self) -> None:
        # Loaded after the emulator bound its queues: a queue with no listener drops.
        counters = "".join(f"  counter in_{d} {{ }}\n  counter loss_{d} {{ }}\n" for d in QUEUE_NUM)
        loss_chains = "".join(f"  chain {d}_loss {{ }}\n" for d in QUEUE_NUM)
        entry = "".join(f'    iifname "{INGRESS_IF[d]}" counter name "in_{d}" jump {d}_loss\n' for d in QUEUE_NUM)
        ruleset = (
            f"table inet {NFT_TABLE} {{\n{counters}{loss_chains}"
            f"  chain forward {{\n    type filter hook forward priority -200; policy accept;\n{entry}  }}\n}}\n"
        )
        self._ns_sh(self.router_ns, ["nft", "-f", "-"], stdin=ruleset)
        # iptables' mangle FORWARD runs at priority -150, after the loss chain (-200).
        for d, n in QUEUE_NUM.items():
            self._ns_sh(self.router_ns, _iptables_nfqueue(INGRESS_IF[d], n))

    # -- live conditions ------------------------------------------------------------------

    def _apply(self, d: str, link: Link) -> None:
        with self._lock:
            self._apply_locked(d, link)

    def _apply_locked(self, d: str, link: Link) -> None:
        if self._closed:
            raise LabError("lab is closed")
        dev = EGRESS_IF[d]
        rate = link.rate_bps or UNLIMITED_RATE_BPS
        tc_batch = (
            f"class change dev {dev} parent 1: classid 1:1 htb rate {rate}bit quantum 1514\n"
            f"qdisc change dev {dev} parent 1:1 handle 10: bfifo limit {link.queue_limit_bytes()}\n"
        )
        _run(["tc", "-n", self.router_ns, "-batch", "-"], stdin=tc_batch)
        nft = f"flush chain inet {NFT_TABLE} {d}_loss\n"
        threshold = link.loss_threshold()
        if threshold > 0:
            nft += (
                f"add rule inet {NFT_TABLE} {d}_loss numgen random mod {LOSS_MODULUS} < {threshold}"
                f' counter name "loss_{d}" drop\n'
            )
        self._ns_sh(self.router_ns, ["nft", "-f", "-"], stdin=nft)  # one atomic transaction
        assert self._emulator is not None
        self._emulator.request({"dir": d, "delay_ms": link.delay_ms, "jitter_ms": link.jitter_ms})
        self._links[d] = link

    def set_downlink(self, link: Link) -> None:
        """Apply ``link`` to node -> viewer; returns once it is in force."""
        self._apply("down", link)

    def set_uplink(self, link: Link) -> None:
        """Apply ``link`` to viewer -> node; returns once it is in force."""
        self._apply("up", link)

    @property
    def downlink(self) -> Link:
        """The conditions now in force node -> viewer."""
        return self._links["down"]

    @property
    def uplink(self) -> Link:
        """The conditions now in force viewer -> node."""
        return self._links["up"]

    def play(self, steps: Sequence[Step], stop: threading.Event | None = None) -> list[float]:
        """Run a scripted scenario: apply each step ``at_s`` seconds after the call (monotonic).

        Blocks until the last step is applied (run it in a thread to script conditions under a
        live flow).  Returns, per applied step, the ``time.monotonic()`` seconds when it was in
        force.  Ends early when ``stop`` is set or the lab is closed.
        """
        stop = stop or threading.Event()
        start_s = time.monotonic()
        applied: list[float] = []
        for step in sorted(steps, key=lambda st: st.at_s):
            if stop.wait(max(start_s + step.at_s - time.monotonic(), 0.0)) or self._closed:
                break
            try:
                if step.downlink is not None:
                    self.set_downlink(step.downlink)
                if step.uplink is not None:
                    self.set_uplink(step.uplink)
            except LabError:
                if self._closed:
                    break
                raise
            applied.append(time.monotonic())
        return applied

    # -- processes and rules ----------------------------------------------------------------

    def router_nft(self, ruleset: str) -> None:
        """Load extra nftables rules in the router (e.g. a firewall between node and viewer);
        they go with the namespace on ``close()``."""
        self.nft("router", ruleset)

    # -- measurement ----------------------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Cumulative counts per direction (``"downlink"``, ``"uplink"``), since the Lab started.

        Keys: ``ingress_packets``/``ingress_bytes`` (entered the router), ``loss_dropped_packets``
        /``loss_dropped_bytes`` (dropped by the loss rule), ``delay_held_packets`` (inside the
        delay emulator now), ``queue_dropped_packets`` (bottleneck queue full) and
        ``forwarded_packets``/``forwarded_bytes`` (sent on by the bottleneck; includes the
        router's own few packets such as ARP).  Byte counts are IP bytes, without Ethernet header.
        For TCP, ``ingress_*`` counts GSO aggregates (one per up-to-64 kB burst) while
        ``forwarded_*`` counts wire packets (NFQUEUE segments them); for UDP they match.
        """
        with self._lock:
            return self._counters_locked()

    def _counters_locked(self) -> dict[str, dict[str, int]]:
        if self._closed:
            raise LabError("lab is closed")
        nft = json.loads(self._ns_sh(self.router_ns, ["nft", "-j", "list", "counters", "table", "inet", NFT_TABLE]))
        nft_counts: dict[str, dict[str, int]] = {}
        for item in nft.get("nftables", []):
            counter = item.get("counter")
            if counter:
                nft_counts[counter["name"]] = {"packets": counter["packets"], "bytes": counter["bytes"]}
        assert self._emulator is not None
        held = self._emulator.request({"stats": True})["stats"]
        result: dict[str, dict[str, int]] = {}
        for d, name in (("down", "downlink"), ("up", "uplink")):
            qdiscs = json.loads(_run(["tc", "-n", self.router_ns, "-j", "-s", "qdisc", "show", "dev", EGRESS_IF[d]]))
            root = next(q for q in qdiscs if q.get("root"))
            # tc counts bytes with the Ethernet header (14 bytes a packet); nft counts IP bytes.
            result[name] = {
                "ingress_packets": nft_counts[f"in_{d}"]["packets"],
                "ingress_bytes": nft_counts[f"in_{d}"]["bytes"],
                "loss_dropped_packets": nft_counts[f"loss_{d}"]["packets"],
                "loss_dropped_bytes": nft_counts[f"loss_{d}"]["bytes"],
                "delay_held_packets": held[d]["held"],
                "queue_dropped_packets": root["drops"],
                "forwarded_packets": root["packets"],
                "forwarded_bytes": root["bytes"] - 14 * root["packets"],
            }
        return result

    # -- teardown -------------------------------------------------------------------------

    def _stop_helpers(self) -> None:
        if self._emulator is not None:
            self._emulator.close()
