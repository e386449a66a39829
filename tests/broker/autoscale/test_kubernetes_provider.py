"""The kubernetes provider, through the real kubernetes_asyncio client, against an HTTP stand-in.

The stand-in (`FakeApiServer`) implements only the endpoints the provider calls, with the JSON shapes
the API server sends (Scale, PodList, Pod, Status) and its merge-patch semantics: a ``resourceVersion``
in a patch is a precondition (409 Conflict when stale), ``null`` deletes an annotation, a PATCH with a
content type the server does not accept is a 415.  Every request is recorded, so the tests assert the
exact method, path, query, content type and body, and that the provider makes no request outside
`KUBERNETES_RBAC` (which the chart's Role grants, tests/infra/test_helm.py).

No real cluster is involved; README.md says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from broker.autoscale.providers import (
    KUBERNETES_RBAC,
    LOWEST_DELETION_COST,
    POD_DELETION_COST,
    KubernetesProvider,
    ProviderError,
)

kubernetes_asyncio = pytest.importorskip("kubernetes_asyncio", reason="the kubernetes extra is not installed")

NS = "gpu"
TOKEN = "stand-in-token"
MERGE = "application/merge-patch+json"
PATCH_TYPES = (MERGE, "application/strategic-merge-patch+json", "application/json-patch+json",
               "application/apply-patch+yaml")


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    auth: str


@dataclass
class FakeApiServer:
    """An in-memory slice of the Kubernetes API: workloads (their scale) and pods, in one namespace."""

    selector: dict[str, str] = field(default_factory=lambda: {"app": "render-node", "pool": "p1"})
    replicas: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind plural, name) -> replicas
    # each object has its own resourceVersion (the store revision of its last write), as in etcd
    workload_rv: dict[tuple[str, str], str] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: int = 1000
    requests: list[Req] = field(default_factory=list)
    fail: dict[tuple[str, str], int] = field(default_factory=dict)  # (method, path) -> status to answer
    after_get_scale: Callable[[], None] | None = None  # another writer acting between the read and the patch

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def add_pod(self, name: str, *, ready: bool = True, node: str | None = "gpu-node-1", phase: str = "Running",
                cost: int | None = None) -> None:
        annotations = {POD_DELETION_COST: str(cost)} if cost is not None else {}
        self.pods[name] = {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": self.bump(),
                         "creationTimestamp": "2026-12-01T08:00:00Z", "generateName": "render-node-p1-7d9f8-",
                         "labels": {**self.selector, "pod-template-hash": "7d9f8"}, "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": "render-node-p1-7d9f8", "uid": "uid-rs", "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"containers": [{"name": "render-node", "image": "render-node:0.1.0",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     **({"nodeName": node} if node else {}), "restartPolicy": "Always",
                     "terminationGracePeriodSeconds": 330},
            "status": {"phase": phase, "podIP": "10.244.1.7",
                       "conditions": [{"type": "PodScheduled", "status": "True" if node else "False",
                                       "lastProbeTime": None, "lastTransitionTime": "2026-12-01T08:00:01Z"},
                                      {"type": "Ready", "status": "True" if ready else "False",
                                       "lastProbeTime": None, "lastTransitionTime": "2026-12-01T08:00:09Z"}]},
        }

    # --- JSON bodies ----------------------------------------------------------------------------

    def scale(self, plural: str, name: str) -> dict[str, Any]:
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                             "resourceVersion": self.workload_rv.setdefault((plural, name), "900"),
                             "creationTimestamp": "2026-12-01T07:00:00Z"},
                "spec": {"replicas": self.replicas[(plural, name)]},
                "status": {"replicas": self.replicas[(plural, name)],
                           "selector": ",".join(f"{k}={v}" for k, v in self.selector.items())}}

    @staticmethod
    def status(code: int, reason: str, message: str, **details: Any) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "details": details, "code": code}
        return web.json_response(body, status=code)

    # --- handlers -------------------------------------------------------------------------------

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.requests.append(Req(request.method, request.path, dict(request.query),
                                 request.headers.get("Content-Type", ""), body,
                                 request.headers.get("Authorization", "")))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.status(401, "Unauthorized", "Unauthorized")
        code = self.fail.get((request.method, request.path))
        if code is not None:
            reason = {409: "Conflict", 500: "InternalError", 403: "Forbidden"}.get(code, "Unknown")
            return self.status(code, reason, f"injected {code} for {request.method} {request.path}")
        if request.method == "PATCH" and request.content_type not in PATCH_TYPES:
            return self.status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: {', '.join(PATCH_TYPES)}")
        return await handler(request)

    async def get_scale(self, request: web.Request) -> web.Response:
        plural, name = request.match_info["plural"], request.match_info["name"]
        if (plural, name) not in self.replicas:
            return self.status(404, "NotFound", f'{plural}.apps "{name}" not found', name=name, group="apps",
                               kind=plural)
        body = self.scale(plural, name)
        if self.after_get_scale is not None:
            self.after_get_scale()
        return web.json_response(body)

    async def patch_scale(self, request: web.Request) -> web.Response:
        plural, name = request.match_info["plural"], request.match_info["name"]
        if (plural, name) not in self.replicas:
            return self.status(404, "NotFound", f'{plural}.apps "{name}" not found')
        patch = await request.json()
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != self.workload_rv.setdefault((plural, name), "900"):
            return self.status(409, "Conflict", f'Operation cannot be fulfilled on {plural}.apps "{name}": the '
                               "object has been modified; please apply your changes to the latest version and "
                               "try again", name=name, group="apps", kind=plural)
        if "replicas" in (patch.get("spec") or {}):
            self.replicas[(plural, name)] = int(patch["spec"]["replicas"])
            self.workload_rv[(plural, name)] = self.bump()
        return web.json_response(self.scale(plural, name))

    async def list_pods(self, request: web.Request) -> web.Response:
        want = dict(kv.split("=", 1) for kv in request.query.get("labelSelector", "").split(",") if kv)
        items = [p for p in self.pods.values() if want.items() <= p["metadata"]["labels"].items()]
        return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    async def patch_pod(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        pod = self.pods.get(name)
        if pod is None:
            return self.status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        patch = await request.json()
        notes = pod["metadata"].setdefault("annotations", {})
        for k, v in ((patch.get("metadata") or {}).get("annotations") or {}).items():
            if v is None:
                notes.pop(k, None)
            else:
                notes[k] = v
        pod["metadata"]["resourceVersion"] = self.bump()
        return web.json_response(pod)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.record])
        apps = "/apis/apps/v1/namespaces/{ns}/{plural:deployments|statefulsets}/{name}/scale"
        app.router.add_get(apps, self.get_scale)
        app.router.add_patch(apps, self.patch_scale)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self.patch_pod)
        return app

    def rbac_seen(self) -> set[tuple[str, str, str]]:
        """(verb, API group, resource) of each request, as RBAC names them."""
        out = set()
        for r in self.requests:
            parts = r.path.strip("/").split("/")  # api/v1/namespaces/NS/pods[/NAME], apis/apps/v1/namespaces/...
            group = "" if parts[0] == "api" else parts[1]
            rest = parts[4:] if parts[0] == "api" else parts[5:]
            resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
            verb = {"PATCH": "patch", "DELETE": "delete", "POST": "create"}.get(r.method) or (
                "get" if len(rest) > 1 else "list")
            out.add((verb, group, resource))
        return out


@pytest.fixture
async def k8s(aiohttp_server):  # type: ignore[no-untyped-def]
    """(stand-in, provider) with the provider's client configured to reach the stand-in."""
    from kubernetes_asyncio.client import Configuration

    fake = FakeApiServer()
    server = await aiohttp_server(fake.app())
    cfg = Configuration(host=str(server.make_url("")).rstrip("/"))
    cfg.api_key = {"BearerToken": TOKEN}  # what load_incluster_config sets
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    provider = KubernetesProvider(NS, "render-node-{pool}", "deployment", configuration=cfg)
    yield fake, provider
    await provider.close()


def calls(fake: FakeApiServer) -> list[tuple[str, str, str, Any]]:
    return [(r.method, r.path, r.content_type if r.method == "PATCH" else "", r.body) for r in fake.requests]


SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/render-node-p1/scale"
PODS = f"/api/v1/namespaces/{NS}/pods"


async def test_scale_up_reads_the_scale_then_patches_replicas_with_its_resource_version(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 2
    fake.workload_rv[("deployments", "render-node-p1")] = rv = "4711"
    assert await provider.start_hosts("p1", 3) == []  # a Deployment's new pod names are not known yet
    assert calls(fake) == [("GET", SCALE, "", None),
                           ("PATCH", SCALE, MERGE, {"spec": {"replicas": 5}, "metadata": {"resourceVersion": rv}})]
    assert all(r.auth == f"Bearer {TOKEN}" for r in fake.requests)
    assert fake.replicas[("deployments", "render-node-p1")] == 5


async def test_list_hosts_and_pending_read_the_pods_by_the_scale_selector(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 3
    fake.add_pod("render-node-p1-7d9f8-aaaaa")
    fake.add_pod("render-node-p1-7d9f8-bbbbb", ready=False, node=None, phase="Pending")
    fake.add_pod("render-node-p1-7d9f8-going")  # terminating: parsed from its deletionTimestamp
    fake.pods["render-node-p1-7d9f8-going"]["metadata"].update(deletionTimestamp="2026-12-01T09:00:00Z",
                                                                deletionGracePeriodSeconds=335)
    fake.add_pod("other-pool-pod")
    fake.pods["other-pool-pod"]["metadata"]["labels"] = {"app": "render-node", "pool": "p2"}
    assert await provider.list_hosts("p1") == ["render-node-p1-7d9f8-aaaaa", "render-node-p1-7d9f8-bbbbb"]
    assert await provider.pending("p1") == 1  # 3 replicas, 2 live pods
    assert [(r.method, r.path, r.query) for r in fake.requests] == 2 * [
        ("GET", SCALE, {}), ("GET", PODS, {"labelSelector": "app=render-node,pool=p1"})]


async def test_scale_down_marks_the_drained_pod_cheapest_then_lowers_replicas(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 3
    for n in ("rn-a", "rn-b", "rn-c"):
        fake.add_pod(n)
    assert await provider.can_stop("p1", "rn-b")
    fake.requests.clear()
    rv = fake.workload_rv[("deployments", "render-node-p1")]
    await provider.stop_host("p1", "rn-b")
    assert calls(fake) == [
        ("GET", SCALE, "", None),
        ("GET", PODS, "", None),
        ("PATCH", f"{PODS}/rn-b", MERGE, {"metadata": {"annotations": {POD_DELETION_COST: str(LOWEST_DELETION_COST)}}}),
        ("PATCH", SCALE, MERGE, {"spec": {"replicas": 2}, "metadata": {"resourceVersion": rv}}),
    ]
    assert fake.pods["rn-b"]["metadata"]["annotations"] == {POD_DELETION_COST: "-2147483648"}
    assert fake.replicas[("deployments", "render-node-p1")] == 2


async def test_scale_down_refuses_while_another_pod_would_be_deleted_first(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 3
    fake.add_pod("rn-a")
    fake.add_pod("rn-b")
    fake.add_pod("rn-c", ready=False)  # the ReplicaSet controller would pick this one, not rn-b
    assert not await provider.can_stop("p1", "rn-b")
    with pytest.raises(ProviderError, match="rn-c is not scheduled/running/ready"):
        await provider.stop_host("p1", "rn-b")
    assert [r.method for r in fake.requests] == ["GET", "GET", "GET", "GET"]  # nothing was patched
    assert fake.replicas[("deployments", "render-node-p1")] == 3


async def test_a_conflict_on_the_scale_patch_is_a_clear_error_and_the_annotation_is_taken_back(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 2
    fake.add_pod("rn-a")
    fake.add_pod("rn-b")
    fake.fail[("PATCH", SCALE)] = 409
    with pytest.raises(ProviderError) as err:
        await provider.stop_host("p1", "rn-a")
    assert str(err.value) == (f"kubernetes API: patch deployment {NS}/render-node-p1/scale: 409 Conflict: "
                              f"injected 409 for PATCH {SCALE}")
    assert calls(fake)[-2:] == [
        ("PATCH", SCALE, MERGE, {"spec": {"replicas": 1}, "metadata": {"resourceVersion": "900"}}),
        ("PATCH", f"{PODS}/rn-a", MERGE, {"metadata": {"annotations": {POD_DELETION_COST: None}}}),  # null deletes
    ]
    assert fake.pods["rn-a"]["metadata"]["annotations"] == {}  # not left marked "delete me first"
    assert fake.replicas[("deployments", "render-node-p1")] == 2


async def test_a_stale_resource_version_is_refused_by_the_server_not_applied(k8s) -> None:
    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 2

    def other_writer() -> None:  # scales the Deployment between the provider's read and its patch
        fake.replicas[("deployments", "render-node-p1")] = 4
        fake.workload_rv[("deployments", "render-node-p1")] = fake.bump()

    fake.after_get_scale = other_writer
    with pytest.raises(ProviderError, match=r"409 Conflict: Operation cannot be fulfilled on deployments.apps"):
        await provider.start_hosts("p1", 1)
    assert fake.replicas[("deployments", "render-node-p1")] == 4  # the other writer's value stands


async def test_statefulset_mode_scales_by_ordinal_and_never_touches_pods(k8s) -> None:
    fake, provider = k8s
    provider.kind = "statefulset"
    fake.replicas[("statefulsets", "render-node-p1")] = 3
    assert await provider.start_hosts("p1", 2) == ["render-node-p1-3", "render-node-p1-4"]
    await provider.stop_host("p1", "render-node-p1-4")
    with pytest.raises(ProviderError, match="highest ordinal"):
        await provider.stop_host("p1", "render-node-p1-0")
    sts = f"/apis/apps/v1/namespaces/{NS}/statefulsets/render-node-p1/scale"
    assert [(m, p, c, b["spec"]["replicas"] if b else None) for m, p, c, b in calls(fake)] == [
        ("GET", sts, "", None), ("PATCH", sts, MERGE, 5), ("GET", sts, "", None), ("PATCH", sts, MERGE, 4),
        ("GET", sts, "", None)]
    assert fake.replicas[("statefulsets", "render-node-p1")] == 4


async def test_server_errors_and_missing_workloads_are_provider_errors_naming_the_request(k8s) -> None:
    fake, provider = k8s
    with pytest.raises(ProviderError, match=r'get deployment gpu/render-node-p1/scale: 404 Not Found: '
                                            r'deployments.apps "render-node-p1" not found'):
        await provider.list_hosts("p1")
    fake.replicas[("deployments", "render-node-p1")] = 1
    fake.fail[("GET", PODS)] = 500
    with pytest.raises(ProviderError, match=r"list pods in gpu: 500 Internal Server Error: injected 500"):
        await provider.pending("p1")


async def test_no_credentials_is_a_provider_error(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    provider = KubernetesProvider()
    with pytest.raises(ProviderError, match="no Kubernetes credentials"):
        await provider.list_hosts("p1")
    await provider.close()


# --- the autoscaler loop survives the API's errors --------------------------------------------------------


@pytest.fixture
async def api(aiohttp_client, settings_factory, clock):  # type: ignore[no-untyped-def]
    from broker.app import create_app

    return await aiohttp_client(create_app(settings_factory(autoscale_interval_s=0), clock=clock))


async def test_the_autoscaler_records_a_500_as_a_failed_start_and_succeeds_on_the_next_pass(api, clock, k8s) -> None:
    from broker.autoscale.scaler import Scaler
    from broker.keys_app import BROKER
    from tests.broker.autoscale.test_scaler import at, new_session, plan_body, put_plan
    from tests.conftest import setup_pool

    fake, provider = k8s
    fake.replicas[("deployments", "render-node-p1")] = 1
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1)
    for pod in await api.app[BROKER].live.host_ids("p1"):
        fake.add_pod(pod)  # the registered host is the Deployment's one pod
    await put_plan(api, "p1", plan_body(up_threshold=50))
    b = api.app[BROKER]
    scaler = Scaler(b, provider, b.settings)
    at(clock, 2025, 12, 2, 10, 0)  # peak
    await new_session(api, "u1")  # 1 of 1 seat: above 50 %, one more host wanted
    fake.fail[("PATCH", SCALE)] = 500
    [ev] = await scaler.run_once()
    [start] = [a for a in ev.applied if a.kind == "start_hosts"]
    assert start.outcome == "failed"
    assert start.info["error"].startswith(f"kubernetes API: patch deployment {NS}/render-node-p1/scale: 500")
    assert fake.replicas[("deployments", "render-node-p1")] == 1
    del fake.fail[("PATCH", SCALE)]
    clock.advance(60_000)
    [ev] = await scaler.run_once()
    [start] = [a for a in ev.applied if a.kind == "start_hosts"]
    assert start.outcome == "applied" and fake.replicas[("deployments", "render-node-p1")] == 2


async def test_every_operation_stays_inside_the_rbac_the_chart_grants(k8s) -> None:
    fake, provider = k8s
    for plural in ("deployments", "statefulsets"):
        fake.replicas[(plural, "render-node-p1")] = 2
    fake.add_pod("rn-a")
    fake.add_pod("rn-b")
    for kind in ("deployment", "statefulset"):
        provider.kind = kind
        await provider.start_hosts("p1", 1)
        await provider.list_hosts("p1")
        await provider.pending("p1")
        assert await provider.can_stop("p1", "rn-a") == (kind == "deployment")
        if kind == "deployment":
            await provider.stop_host("p1", "rn-a")
        else:
            await provider.stop_host("p1", "render-node-p1-2")
    assert fake.rbac_seen() == set(KUBERNETES_RBAC)
