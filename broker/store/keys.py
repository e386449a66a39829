"""Every Redis key pattern, pub/sub channel and TTL the broker uses.

The Lua scripts build the same keys from the prefix passed as ``ARGV[1]``
(see ``lua/prelude.lua``); the integration tests (``tests/broker``) check the two agree
by reading keys the scripts wrote through this module.

Key map (``P`` is the prefix, default ``rb``)::

    P:pools                     set    pool names
    P:pool:{pool}               hash   pool config (PoolConfig fields)
    P:pool:{pool}:hosts         set    host ids registered in the pool
    P:pool:{pool}:queue         list   queued session ids, head = next to seat
    P:pool:{pool}:avail         zset   placement index: up hosts with a free seat, scored for the pool's
                                       strategy (breadth-first: used * 2^20 + 2^20 - 1 - free; depth-first:
                                       -used; ties by host id); the seating step reads its head
    P:pool:{pool}:rollout       hash   a canary rollout's live half: candidate ``version``, ``share_pct``, ``n``
                                       (the pool's seating counter that picks each seating's version class);
                                       exists while the pool has a rollout (the policy is in SQL)
    P:pool:{pool}:avail:{c}     zset   while a rollout exists: the avail index split by version class, c = ``c``
                                       (hosts of the candidate version) or ``s`` (the rest), same scores
    P:pool:{pool}:staged        zset   the pool's staged sessions (warm, nobody's yet; ``staged`` setting): session
                                       id -> 0 once its node reported it ready, 1 while it starts; their records
                                       (state ``staged``, no user) are in no user set, P:live or deadline set
    P:staged:seq                string counter the ids of staged sessions are derived from (sha1 of prefix,
                                       counter, time and host)
    P:pool:{pool}:stats         hash   counters: hosts_{state}, seats_total / seats_free (up hosts),
                                       seats_used (hosts not down), s_{state} live sessions by state
    P:pool:{pool}:waits         hash   queue wait histogram of every seating (request -> seat, 0 when seated at
                                       once): b{i} seatings whose wait fell in bucket i of QUEUE_WAIT_BUCKETS_S
                                       (not cumulative; b{n+1} = over the last bound), sum_ms; lives with the pool
    P:hosts                     set    every host id
    P:host:{id}                 hash   pool, address, state, gpus (JSON), u:{gpu} used and s:{gpu} seats,
                                       g (GPU indices), seats/used/free/acct (what it last added to its
                                       pool's counters), heartbeat_ms, telemetry
    P:host:{id}:lease           string heartbeat lease, TTL = host_lease_ttl_s on Redis's clock (the lease
                                       itself; P:due:leases says when to look at it)
    P:host:{id}:sessions        set    session ids seated on the host
    P:host:{id}:retired         string marker: an admin or the autoscaler removed the host; its id may
                                       not register (or heartbeat) again until the TTL,
                                       RETIRED_HOST_TTL_S, runs out (or a provider starts that id anew)
    P:session:{id}              hash   session record (state_ms: last node-reported transition, warned_ms);
                                       TTL ENDED_SESSION_TTL_S once ended
    P:session:{id}:tab          string "<tab> <socket>": the browser tab (signaling ``tab`` id) and its socket that
                                       hold the session's viewer,
                                       TTL VIEWER_TAB_TTL_MS past its socket's last renewal
    P:session:{id}:shares       hash   share id -> JSON {role, by, shadow, created_ms, expires_at}: the session's
                                       live share links; expires with the latest link (PEXPIREAT)
    P:session:{id}:viewers      zset   "<share id> <viewer id>" -> ms its signaling socket's hold runs out
                                       (renewed every VIEWER_TAB_RENEW_S; SHARE_VIEWER_TTL_MS past the last)
    P:session:{id}:control      string "<share id> <viewer id>": the one share viewer the owner handed control
                                       to (share.lua; dropped when that viewer leaves or its link is revoked)
    P:share:{share id}:revoked  string marker: the link was revoked; lives for the token's remaining life
    P:user:{user}:pool:{pool}   set    the user's live session ids in a pool
    P:live                      set    every live (not ended) session id
    P:due:leases                zset   host id -> when its lease runs out (ms, renewed by each heartbeat); the
                                       reaper looks only at what is due
    P:due:sessions              zset   live session id -> when the timeout policy could end it (ms), or a
                                       reaper's claim (now + REAP_CLAIM_MS)
    P:due:warn                  zset   seated session not yet warned -> when max-duration ends it (ms)
    P:due:purge                 zset   down host id -> when its record is dropped (ms)
    P:index:version             string INDEX_VERSION once the indexes above were built from the records
    P:epoch                     string this Redis's live-state generation (a random id, no TTL), written
                                       when a broker starts on it or restores it; its absence means the
                                       state was lost (Redis restarted empty, a failover that lost writes)
    P:reaper:pass               string Redis time (ms) of the last reaper pass any replica made, TTL
                                       REAPER_PASS_TTL_S; a gap longer than a third of a lease means nobody
                                       could reach Redis, and every lease alive at that pass gets a full one
    P:recovery                  string JSON {epoch, at_ms, until_ms} of the last state-loss recovery, TTL
                                       RECOVERY_TTL_S; once until_ms passes, one replica ends in SQL the
                                       sessions SQL still counts live that no node re-claimed (state_lost)
    P:outbox                    list   JSON records (session queued/start/end) waiting for SQL
    P:outbox:processing         list   records being written to SQL (recovered if a replica dies)
    P:lock:{name}               string leader locks for once-per-cluster loops, TTL'd
                                       (the autoscaler's per-pool lock is named ``autoscale:{pool}``)
    P:autoscale:{pool}          string JSON autoscaler record (AutoscaleState, hosts starting, last
                                       evaluation), TTL AUTOSCALE_STATE_TTL_S, rewritten every pass

Channels: ``P:ev:session:{id}`` (state changes), ``P:ev:pool:{pool}`` (queue moved),
``P:node:{host}`` (commands for a node), ``P:sig:{session}:client`` (signaling to the viewer),
``P:sig:{session}:viewer:{viewer}`` (signaling to one share viewer), ``P:sig:{session}:shares`` (revocations,
published by the revoking Lua step).
"""

from __future__ import annotations

from typing import Final

ENDED_SESSION_TTL_S: Final = 3600  # ended sessions stay readable for an hour, SQL keeps them forever
DOWN_HOST_TTL_S: Final = 3600  # a down host's record is kept an hour for the dashboard
DEFAULT_HOST_LEASE_TTL_S: Final = 15  # three missed 5 s heartbeats
OUTBOX_STALE_MS: Final = 30_000  # a record in processing this long was orphaned by a dead replica
# P:session:{id}:tab (string, the browser tab whose signaling socket holds the session's viewer) lives
# this long past its holder's last renewal (every VIEWER_TAB_RENEW_S while its socket is open)
VIEWER_TAB_TTL_MS: Final = 30_000
VIEWER_TAB_RENEW_S: Final = 10.0
SHARE_VIEWER_TTL_MS: Final = 30_000  # a share viewer's hold lives this long past its socket's last renewal
CONTROL_TTL_MS: Final = 86_400_000  # a viewer's control lives at most a day (share tokens do too)
SHARES_MAX: Final = 16  # live share links per session
AUTOSCALE_STATE_TTL_S: Final = 7 * 86_400  # an autoscaler record no replica has rewritten for a week is dropped
AUTOSCALE_LOCK_MIN_TTL_S: Final = 10  # the per-pool leader lock lives max(this, 2 intervals)
# A removed host stays refused this long: well past a provider's stop (SIGTERM, a pod's 30 s grace
# period) and a node's heartbeat retries, short enough that an id removed by mistake comes back soon.
RETIRED_HOST_TTL_S: Final = 300
# The record state (P:session:{id} ``state``) of a staged session: started on a node for the next user of
# its pool, nobody's yet.  Broker-internal: a user only ever sees it as their own starting or running
# session (same id), and a node's start command carries ``"staged": true`` for one.
STAGED_STATE: Final = "staged"
INDEX_VERSION: Final = "1"  # layout of the P:pool:*:avail/stats and P:due:* indexes; a change rebuilds them
REAPER_PASS_TTL_S: Final = 86_400  # a reaper-pass stamp nobody renewed for a day is dropped (no grace then)
RECOVERY_TTL_S: Final = 86_400  # the record of the last state-loss recovery
# Upper bounds (seconds) of the queue wait histogram's buckets (P:pool:{pool}:waits; the Lua seating step
# counts into them, /metrics exports them as render_broker_queue_wait_seconds): a seat at once lands in the
# first; the last is past the default queue timeout (a pool's queue_timeout_s, 600 s)
QUEUE_WAIT_BUCKETS_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
REAP_CLAIM_MS: Final = 30_000  # a claimed deadline comes due again this long after a replica took it


class Keys:
    """Key builders for one prefix (tests use a unique prefix per test)."""

    def __init__(self, prefix: str = "rb") -> None:
        self.prefix = prefix
        self.pools = f"{prefix}:pools"
        self.hosts = f"{prefix}:hosts"
        self.live = f"{prefix}:live"
        self.outbox = f"{prefix}:outbox"
        self.outbox_processing = f"{prefix}:outbox:processing"
        self.due_leases = f"{prefix}:due:leases"
        self.due_sessions = f"{prefix}:due:sessions"
        self.due_warn = f"{prefix}:due:warn"
        self.due_purge = f"{prefix}:due:purge"
        self.index_version = f"{prefix}:index:version"
        self.epoch = f"{prefix}:epoch"
        self.reaper_pass = f"{prefix}:reaper:pass"
        self.recovery = f"{prefix}:recovery"

    def pool(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}"

    def pool_hosts(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:hosts"

    def pool_queue(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:queue"

    def pool_avail(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:avail"

    def pool_rollout(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:rollout"

    def pool_avail_class(self, name: str, cls: str) -> str:
        """The avail index of one version class (``c`` candidate, ``s`` stable) during a rollout."""
        return f"{self.prefix}:pool:{name}:avail:{cls}"

    def pool_staged(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:staged"

    def pool_stats(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:stats"

    def pool_waits(self, name: str) -> str:
        return f"{self.prefix}:pool:{name}:waits"

    def host(self, host_id: str) -> str:
        return f"{self.prefix}:host:{host_id}"

    def host_lease(self, host_id: str) -> str:
        return f"{self.prefix}:host:{host_id}:lease"

    def host_sessions(self, host_id: str) -> str:
        return f"{self.prefix}:host:{host_id}:sessions"

    def host_retired(self, host_id: str) -> str:
        return f"{self.prefix}:host:{host_id}:retired"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}"

    def session_tab(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:tab"

    def session_shares(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:shares"

    def session_viewers(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:viewers"

    def session_control(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:control"

    def share_revoked(self, share_id: str) -> str:
        return f"{self.prefix}:share:{share_id}:revoked"

    def user_sessions(self, user: str, pool: str) -> str:
        return f"{self.prefix}:user:{user}:pool:{pool}"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"

    @staticmethod
    def autoscale_lock_name(pool: str) -> str:
        """The name (for ``lock``/``LiveStore.try_lock``) of a pool's autoscaler leader lock."""
        return f"autoscale:{pool}"

    def autoscale(self, pool: str) -> str:
        return f"{self.prefix}:autoscale:{pool}"

    # pub/sub channels
    def chan_session(self, session_id: str) -> str:
        return f"{self.prefix}:ev:session:{session_id}"

    def chan_pool(self, pool: str) -> str:
        return f"{self.prefix}:ev:pool:{pool}"

    def chan_node(self, host_id: str) -> str:
        return f"{self.prefix}:node:{host_id}"

    def chan_signal_client(self, session_id: str) -> str:
        return f"{self.prefix}:sig:{session_id}:client"

    def chan_signal_viewer(self, session_id: str, viewer_id: str) -> str:
        return f"{self.prefix}:sig:{session_id}:viewer:{viewer_id}"

    def chan_shares(self, session_id: str) -> str:
        return f"{self.prefix}:sig:{session_id}:shares"
