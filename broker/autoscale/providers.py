"""Host providers: who actually adds and removes render hosts when the autoscaler asks.

Job: give the autoscaler service (`broker.autoscale.scaler`) one small interface, `HostProvider`, over
three ways of running render nodes:

- `StaticProvider`: a fixed inventory (bare-metal GPU boxes registered by hand).  It can
  neither start nor stop anything, so the autoscaler only drains and undrains; a drained
  empty host stays registered and idle until it is undrained.
- `LocalProvider`: real ``render-node`` processes on this machine, one per host, each in its
  own session/process group (``start_new_session``) so a stop reaches the node's children too:
  SIGTERM to the group, SIGKILL after ``stop_timeout_s``.  `close` stops every node it started,
  so nothing outlives the broker.  The argv is a template (`DEFAULT_NODE_COMMAND`) so tests and
  deployments can substitute their own command.
- `KubernetesProvider`: scales the Deployment (default) or StatefulSet that runs a pool's render
  nodes; host id == pod name (start the streamer with ``--host-id $(POD_NAME)``).  Every request
  body it sends is built by a pure function below (`scale_patch`, `deletion_cost_patch`,
  `deployment_stop_blocker`, `statefulset_stop_blocker`, `pending_pods`), unit-tested without a
  cluster.  The client library (``kubernetes_asyncio``) is imported lazily, so it is optional.
  The only requests it makes (so the only RBAC it needs, see infra/helm's Role): get and patch
  ``{deployments,statefulsets}/scale`` (the scale's ``status.selector`` names the pods), list pods,
  patch a pod (its deletion-cost annotation); patches are JSON merge patches.  An API error becomes
  a `ProviderError` naming the request, the status and the API server's message.
  tests/broker/autoscale/test_kubernetes_provider.py runs it against an HTTP stand-in for those
  endpoints; it has not run against a real cluster.

  Limits, stated honestly.  Kubernetes gives no API to "remove this pod and shrink by one":
    * StatefulSets always scale down by the highest ordinal and ignore
      ``controller.kubernetes.io/pod-deletion-cost`` (that annotation is read only by the
      ReplicaSet controller, i.e. Deployments/ReplicaSets).  So in ``statefulset`` mode a
      drained empty host is stopped only when it *is* the highest ordinal; any other drained
      host stays drained (idle, still billed) until the hosts above it are gone.  That is the
      only StatefulSet scale-down that never touches a busy pod.
    * In ``deployment`` mode (the default and the recommended one) the provider annotates the
      drained empty pod with the lowest possible deletion cost, then lowers ``replicas`` by one
      with the scale subresource's resourceVersion as a precondition (a concurrent change makes
      the patch fail with 409 instead of removing the wrong pod).  The ReplicaSet controller
      ranks unscheduled < pending < not-ready pods *before* it looks at deletion cost, so the
      provider refuses (`can_stop` is False) while any other pod is unscheduled, not running,
      not ready or terminating, or already carries an equally low cost; the autoscaler retries
      at its next evaluation.  Deletion cost is best-effort by Kubernetes' own definition (it
      needs the PodDeletionCost feature, on by default since 1.22); a node's lease and the
      broker's ``remove_host`` re-check still guarantee no live session is on the host.
    * New pods' names are not known when ``replicas`` is raised: `start_hosts` returns no ids
      and `pending` reports replicas not yet backed by a pod.

Concurrency: one provider per broker process, used by the autoscaler loop only (one pool at a
time under that pool's leader lock) and by shutdown.  `LocalProvider` keeps its children in a
dict owned by the event loop; nothing here blocks the loop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

from rbcommon.procs import kill_group, terminate_group

log = logging.getLogger(__name__)

PROVIDERS: Final = ("static", "local", "kubernetes")
# "--opt=value": a token that starts with "-" (token_urlsafe makes those) is still read as the value
DEFAULT_NODE_COMMAND: Final = ("{python}", "-m", "streamer", "--broker-url", "{broker_url}",
                               "--node-token={node_token}", "--pool", "{pool}", "--host-id", "{host_id}")
PLACEHOLDERS: Final = ("python", "broker_url", "node_token", "pool", "host_id")
POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_DELETION_COST: Final = -(2**31)  # the annotation is an int32; lower is deleted first
HOST_ID_MAX: Final = 63  # broker.models.NAME_RE
# The request bodies built below are RFC 7386 JSON merge patches (null deletes a key), so they are sent as such: left
# to itself, kubernetes_asyncio labels a dict body strategic-merge-patch.
MERGE_PATCH: Final = "application/merge-patch+json"
# (verb, API group, resource) of every request KubernetesProvider makes: exactly the RBAC it needs.
# infra/helm's Role grants these and nothing else (tests/infra/test_helm.py); the stand-in test checks
# the provider makes no other request.
KUBERNETES_RBAC: Final = (("get", "apps", "deployments/scale"), ("patch", "apps", "deployments/scale"),
                          ("get", "apps", "statefulsets/scale"), ("patch", "apps", "statefulsets/scale"),
                          ("list", "", "pods"), ("patch", "", "pods"))


class ProviderError(Exception):
    """A provider could not do what was asked (the autoscaler logs it and retries next pass)."""


class HostProvider(abc.ABC):
    """Adds and removes render hosts of a pool.  Host ids are the ids nodes register with."""

    name: str = "abstract"
    can_start: bool = True  # False: start_hosts always fails; the autoscaler only drains/undrains

    @abc.abstractmethod
    async def start_hosts(self, pool: str, n: int) -> list[str]:
        """Ask for ``n`` more hosts in ``pool``; returns the ids it knows (may be fewer, see `pending`)."""

    @abc.abstractmethod
    async def stop_host(self, pool: str, host_id: str) -> None:
        """Stop (deprovision) one host; the broker has already deregistered it. Unknown ids are a no-op."""

    @abc.abstractmethod
    async def list_hosts(self, pool: str) -> list[str]:
        """Ids of the hosts this provider runs for ``pool`` (registered with the broker or not)."""

    async def can_stop(self, pool: str, host_id: str) -> bool:
        """Whether `stop_host` can remove exactly this host now (checked before it is deregistered)."""
        return True

    async def pending(self, pool: str) -> int:
        """Hosts requested but not yet visible in `list_hosts`."""
        return 0

    async def close(self) -> None:
        """Release resources; a provider that owns processes stops them."""
        return None  # default: nothing to release


# --- static ---------------------------------------------------------------------------------


class StaticProvider(HostProvider):
    """A fixed inventory: hosts register themselves; nothing can be started or stopped."""

    name = "static"
    can_start = False

    async def start_hosts(self, pool: str, n: int) -> list[str]:
        raise ProviderError("the static provider cannot start hosts (fixed inventory)")

    async def stop_host(self, pool: str, host_id: str) -> None:
        raise ProviderError("the static provider cannot stop hosts (fixed inventory)")

    async def list_hosts(self, pool: str) -> list[str]:
        return []

    async def can_stop(self, pool: str, host_id: str) -> bool:
        return False


# --- local processes ------------------------------------------------------------------------


def build_argv(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Replace ``{name}`` placeholders in each argument (plain substitution: other braces are kept)."""
    out = []
    for arg in template:
        for k, v in values.items():
            arg = arg.replace("{" + k + "}", v)
        out.append(arg)
    return out


def new_host_id(pool: str) -> str:
    """A fresh host id for ``pool`` that fits the broker's host-name rule."""
    return f"{pool[:HOST_ID_MAX - 9]}-{uuid.uuid4().hex[:8]}"


@dataclass
class LocalNode:
    host_id: str
    pool: str
    proc: asyncio.subprocess.Process
    log_file: IO[bytes] | None = None


class LocalProvider(HostProvider):
    """Render nodes as child processes of the broker (one machine)."""

    name = "local"

    def __init__(self, command: Sequence[str] = DEFAULT_NODE_COMMAND, *, broker_url: str, node_token: str,
                 stop_timeout_s: float = 10.0, log_dir: str | None = None, env: Mapping[str, str] | None = None,
                 id_factory: Callable[[str], str] = new_host_id) -> None:
        self.command = tuple(command) or DEFAULT_NODE_COMMAND
        self.broker_url = broker_url
        self.node_token = node_token
        self.stop_timeout_s = stop_timeout_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.env = dict(env) if env is not None else None
        self.id_factory = id_factory
        self.nodes: dict[str, LocalNode] = {}

    def argv(self, pool: str, host_id: str) -> list[str]:
        return build_argv(self.command, {"python": sys.executable, "broker_url": self.broker_url,
                                         "node_token": self.node_token, "pool": pool, "host_id": host_id})

    async def start_hosts(self, pool: str, n: int) -> list[str]:
        started: list[str] = []
        for _ in range(n):
            host_id = self.id_factory(pool)
            log_file: IO[bytes] | None = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_file = open(self.log_dir / f"{host_id}.log", "ab")  # noqa: ASYNC230 (kept open for the child)
            out: IO[bytes] | int = log_file if log_file is not None else subprocess.DEVNULL
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv(pool, host_id), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True, env=self.env)
            except OSError as exc:
                if log_file is not None:
                    log_file.close()
                raise ProviderError(f"could not start a render node for pool {pool!r}: {exc}") from exc
            self.nodes[host_id] = LocalNode(host_id, pool, proc, log_file)
            log.info("started render node %s (pid %d) for pool %s", host_id, proc.pid, pool)
            started.append(host_id)
        return started

    async def stop_host(self, pool: str, host_id: str) -> None:
        node = self.nodes.pop(host_id, None)
        if node is None:
            return
        code = await terminate_group(node.proc, self.stop_timeout_s)
        if node.log_file is not None:
            node.log_file.close()
        log.info("stopped render node %s (pid %d, exit %s)", host_id, node.proc.pid, code)

    def _prune(self) -> None:
        for host_id, node in list(self.nodes.items()):
            if node.proc.returncode is not None:
                log.warning("render node %s (pid %d) exited with %s", host_id, node.proc.pid, node.proc.returncode)
                del self.nodes[host_id]
                kill_group(node.proc.pid)  # children it may have left behind
                if node.log_file is not None:
                    node.log_file.close()

    async def list_hosts(self, pool: str) -> list[str]:
        self._prune()
        return sorted(h for h, node in self.nodes.items() if node.pool == pool)

    async def close(self) -> None:
        """Stop every node this provider started (broker shutdown)."""
        nodes = list(self.nodes.values())
        await asyncio.gather(*(self.stop_host(n.pool, n.host_id) for n in nodes), return_exceptions=True)


# --- Kubernetes: pure request builders -------------------------------------------------------

WORKLOAD_KINDS: Final = ("deployment", "statefulset")
_ORDINAL_RE: Final = re.compile(r"^(.*)-(\d+)$")


@dataclass(frozen=True)
class PodInfo:
    """What the provider needs from a pod (parsed from the API's JSON form)."""

    name: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool
    scheduled: bool
    terminating: bool
    deletion_cost: int | None = None

    @classmethod
    def from_dict(cls, pod: Mapping[str, Any]) -> PodInfo:
        """From a pod as JSON (``ApiClient.sanitize_for_serialization`` output: camelCase keys)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        raw_cost = (meta.get("annotations") or {}).get(POD_DELETION_COST)
        cost: int | None
        try:
            cost = int(raw_cost) if raw_cost is not None else None
        except ValueError:
            cost = None
        return cls(name=str(meta.get("name", "")), phase=str(status.get("phase") or "Unknown"), ready=ready,
                   scheduled=bool(spec.get("nodeName")), terminating=meta.get("deletionTimestamp") is not None,
                   deletion_cost=cost)


def status_message(body: object) -> str:
    """The ``message`` of a Kubernetes ``Status`` error body (JSON), or the body itself, shortened."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:300] or "no response body"
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return str(doc["message"])
    return text[:300]


def workload_name(template: str, pool: str) -> str:
    return template.replace("{pool}", pool)


def label_selector(match_labels: Mapping[str, str]) -> str:
    """``{"app": "render-node", "pool": "p1"}`` -> ``"app=render-node,pool=p1"`` (sorted)."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def scale_patch(replicas: int, resource_version: str | None = None) -> dict[str, Any]:
    """Body for ``patch_namespaced_{deployment,stateful_set}_scale``.

    With ``resource_version`` the API server applies it only if the scale object did not change
    since it was read (409 Conflict otherwise): a scale-down never races another writer.
    """
    if replicas < 0:
        raise ValueError("replicas must be >= 0")
    body: dict[str, Any] = {"spec": {"replicas": replicas}}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return body


def deletion_cost_patch(cost: int | None) -> dict[str, Any]:
    """Body for ``patch_namespaced_pod`` setting (or, with None, removing) the pod-deletion-cost annotation."""
    if cost is not None and not -(2**31) <= cost < 2**31:
        raise ValueError("pod-deletion-cost is an int32")
    return {"metadata": {"annotations": {POD_DELETION_COST: None if cost is None else str(cost)}}}


def pending_pods(replicas: int, pods: Sequence[PodInfo]) -> int:
    """Replicas asked for that no (non-terminating) pod stands for yet."""
    return max(0, replicas - sum(1 for p in pods if not p.terminating))


def deployment_stop_blocker(pods: Sequence[PodInfo], host_id: str) -> str | None:
    """Why removing ``host_id`` by deletion cost + replicas-1 could remove another pod, or None when safe.

    The ReplicaSet controller deletes, in order: unscheduled, then pending/unknown, then not-ready
    pods, and only then the lowest deletion cost.  So the target must be the one pod it would pick.
    """
    live = [p for p in pods if not p.terminating]
    target = next((p for p in live if p.name == host_id), None)
    if target is None:
        return f"pod {host_id} is not a live pod of the workload"
    if len(pods) != len(live):
        return "another pod is terminating; wait until the workload settles"
    for p in live:
        if p.name == host_id:
            continue
        if not p.scheduled or p.phase != "Running" or not p.ready:
            return f"pod {p.name} is not scheduled/running/ready and would be deleted first"
        if p.deletion_cost is not None and p.deletion_cost <= LOWEST_DELETION_COST:
            return f"pod {p.name} already has the lowest deletion cost"
    return None


def statefulset_ordinal(statefulset: str, pod: str) -> int | None:
    m = _ORDINAL_RE.match(pod)
    if m is None or m.group(1) != statefulset:
        return None
    return int(m.group(2))


def statefulset_stop_blocker(statefulset: str, replicas: int, host_id: str) -> str | None:
    """A StatefulSet removes its highest ordinal only: None when ``host_id`` is ``<name>-<replicas-1>``."""
    ordinal = statefulset_ordinal(statefulset, host_id)
    if ordinal is None:
        return f"pod {host_id} is not a pod of statefulset {statefulset}"
    if ordinal != replicas - 1:
        return (f"statefulset {statefulset} scales down by highest ordinal ({statefulset}-{replicas - 1}); "
                f"{host_id} stays drained until it is the highest")
    return None


def statefulset_new_ids(statefulset: str, replicas: int, n: int) -> list[str]:
    """Pod names a StatefulSet creates when scaled from ``replicas`` to ``replicas + n``."""
    return [f"{statefulset}-{i}" for i in range(replicas, replicas + n)]


# --- Kubernetes: the provider ------------------------------------------------------------------


class KubernetesProvider(HostProvider):
    """Scales the workload of each pool (see the module docstring for what works and what cannot)."""

    name = "kubernetes"

    def __init__(self, namespace: str = "default", workload: str = "render-node-{pool}",
                 kind: str = "deployment", *, configuration: Any = None) -> None:
        """``configuration``: a ``kubernetes_asyncio.client.Configuration`` to use as is (tests point it at
        a stand-in API server); None loads the in-cluster service account, else the kubeconfig."""
        if kind not in WORKLOAD_KINDS:
            raise ValueError(f"kubernetes_workload_kind must be one of {', '.join(WORKLOAD_KINDS)}")
        self.namespace = namespace
        self.workload = workload
        self.kind = kind
        self.configuration = configuration
        self._api: Any = None
        self._apps: Any = None
        self._core: Any = None

    async def _connect(self) -> None:
        if self._api is not None:
            return
        try:
            from kubernetes_asyncio import client, config
        except ImportError as exc:
            raise ProviderError("the kubernetes provider needs the kubernetes_asyncio package "
                                "(pip install kubernetes-asyncio)") from exc
        if self.configuration is None:
            loader: Any = config  # untyped package (typed Any here whether or not it is installed)
            try:
                loader.load_incluster_config()
            except config.ConfigException:
                try:
                    await loader.load_kube_config()
                except (config.ConfigException, OSError) as exc:
                    raise ProviderError(f"no Kubernetes credentials: not in a pod (no service account) and "
                                        f"no usable kubeconfig ({exc})") from exc
        self._api = client.ApiClient(self.configuration)
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API request; an HTTP error becomes a ProviderError naming the request, status and the
        API server's own message (its Status body), e.g. a 409 Conflict on a stale resourceVersion."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await fn(*args, **kwargs)
        except ApiException as exc:
            raise ProviderError(f"kubernetes API: {what}: {exc.status} {exc.reason}: "
                                f"{status_message(exc.body)}") from exc

    def _json(self, obj: Any) -> dict[str, Any]:
        data: dict[str, Any] = self._api.sanitize_for_serialization(obj)
        return data

    async def _scale(self, pool: str) -> tuple[str, dict[str, Any]]:
        """(workload name, its scale subresource as JSON: spec.replicas, status.selector, resourceVersion)."""
        await self._connect()
        name = workload_name(self.workload, pool)
        fn = (self._apps.read_namespaced_deployment_scale if self.kind == "deployment"
              else self._apps.read_namespaced_stateful_set_scale)
        scale = await self._call(f"get {self.kind} {self.namespace}/{name}/scale", fn, name, self.namespace)
        return name, self._json(scale)

    async def _patch_scale(self, name: str, body: dict[str, Any]) -> None:
        fn = (self._apps.patch_namespaced_deployment_scale if self.kind == "deployment"
              else self._apps.patch_namespaced_stateful_set_scale)
        await self._call(f"patch {self.kind} {self.namespace}/{name}/scale", fn, name, self.namespace, body,
                         _content_type=MERGE_PATCH)

    async def _patch_pod(self, host_id: str, body: dict[str, Any]) -> None:
        await self._call(f"patch pod {self.namespace}/{host_id}", self._core.patch_namespaced_pod,
                         host_id, self.namespace, body, _content_type=MERGE_PATCH)

    async def _pods(self, scale: Mapping[str, Any]) -> list[PodInfo]:
        # the scale subresource carries the workload's selector in its string form ("app=x,pool=y")
        selector = (scale.get("status") or {}).get("selector") or ""
        if not selector:
            raise ProviderError("the workload's scale has no status.selector: cannot tell its pods")
        res = await self._call(f"list pods in {self.namespace}", self._core.list_namespaced_pod, self.namespace,
                               label_selector=selector)
        return [PodInfo.from_dict(p) for p in self._json(res).get("items") or []]

    @staticmethod
    def _replicas(scale: Mapping[str, Any]) -> int:
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def start_hosts(self, pool: str, n: int) -> list[str]:
        name, scale = await self._scale(pool)
        replicas = self._replicas(scale)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        await self._patch_scale(name, scale_patch(replicas + n, rv))
        log.info("scaled %s %s/%s from %d to %d replicas", self.kind, self.namespace, name, replicas, replicas + n)
        return statefulset_new_ids(name, replicas, n) if self.kind == "statefulset" else []

    async def can_stop(self, pool: str, host_id: str) -> bool:
        name, scale = await self._scale(pool)
        if self.kind == "statefulset":
            why = statefulset_stop_blocker(name, self._replicas(scale), host_id)
        else:
            why = deployment_stop_blocker(await self._pods(scale), host_id)
        if why:
            log.info("not removing %s yet: %s", host_id, why)
        return why is None

    async def stop_host(self, pool: str, host_id: str) -> None:
        name, scale = await self._scale(pool)
        replicas = self._replicas(scale)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if self.kind == "statefulset":
            why = statefulset_stop_blocker(name, replicas, host_id)
            if why:
                raise ProviderError(why)
            await self._patch_scale(name, scale_patch(replicas - 1, rv))
            log.info("scaled statefulset %s/%s from %d to %d replicas, removing %s", self.namespace, name,
                     replicas, replicas - 1, host_id)
            return
        why = deployment_stop_blocker(await self._pods(scale), host_id)
        if why:
            raise ProviderError(why)
        await self._patch_pod(host_id, deletion_cost_patch(LOWEST_DELETION_COST))
        try:
            await self._patch_scale(name, scale_patch(replicas - 1, rv))
        except Exception:
            # the scale-down did not happen: do not leave a pod marked "delete me first"
            with contextlib.suppress(Exception):
                await self._patch_pod(host_id, deletion_cost_patch(None))
            raise
        log.info("scaled deployment %s/%s from %d to %d replicas, removing %s", self.namespace, name, replicas,
                 replicas - 1, host_id)

    async def list_hosts(self, pool: str) -> list[str]:
        _name, scale = await self._scale(pool)
        return sorted(p.name for p in await self._pods(scale) if not p.terminating)

    async def pending(self, pool: str) -> int:
        _name, scale = await self._scale(pool)
        return pending_pods(self._replicas(scale), await self._pods(scale))

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None


# --- from settings --------------------------------------------------------------------------


class ProviderSettings(Protocol):
    """The settings a provider is built from (``broker.settings.BrokerSettings`` has them all)."""

    @property
    def host_provider(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def node_token(self) -> str: ...
    @property
    def local_node_command(self) -> list[str]: ...
    @property
    def local_broker_url(self) -> str: ...
    @property
    def local_stop_timeout_s(self) -> float: ...
    @property
    def kubernetes_namespace(self) -> str: ...
    @property
    def kubernetes_workload(self) -> str: ...
    @property
    def kubernetes_workload_kind(self) -> str: ...


def provider_from_settings(s: ProviderSettings) -> HostProvider:
    """The provider ``s.host_provider`` names; ValueError for an unknown one."""
    if s.host_provider == "static":
        return StaticProvider()
    if s.host_provider == "local":
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
        url = s.local_broker_url or f"http://{host}:{s.port}"
        return LocalProvider(s.local_node_command or DEFAULT_NODE_COMMAND, broker_url=url, node_token=s.node_token,
                             stop_timeout_s=s.local_stop_timeout_s, log_dir=str(Path(s.data_dir) / "nodes"))
    if s.host_provider == "kubernetes":
        return KubernetesProvider(s.kubernetes_namespace, s.kubernetes_workload, s.kubernetes_workload_kind)
    raise ValueError(f"host_provider must be one of {', '.join(PROVIDERS)}, not {s.host_provider!r}")
