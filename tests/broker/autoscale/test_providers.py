"""Host providers: real child processes for the local provider, pure request builders for Kubernetes."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from broker.autoscale.providers import (
    DEFAULT_NODE_COMMAND,
    LOWEST_DELETION_COST,
    POD_DELETION_COST,
    KubernetesProvider,
    LocalProvider,
    PodInfo,
    ProviderError,
    StaticProvider,
    build_argv,
    deletion_cost_patch,
    deployment_stop_blocker,
    label_selector,
    new_host_id,
    pending_pods,
    provider_from_settings,
    scale_patch,
    statefulset_new_ids,
    statefulset_ordinal,
    statefulset_stop_blocker,
    workload_name,
)
from broker.settings import BrokerSettings
from tests.procs import alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "{pool}", "{host_id}", "{broker_url}"]
# a node that ignores SIGTERM and leaves a grandchild in its process group (whose pid it prints)
STUBBORN = [sys.executable, "-c",
            "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)"]



def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


async def until(cond, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Poll an outside-world condition (a process exiting) with a bound, not a fixed sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# --- local ------------------------------------------------------------------------------------


async def test_local_provider_starts_and_stops_a_real_process_group() -> None:
    ids = iter(["p1-a", "p1-b"])
    prov = LocalProvider(SLEEPER, broker_url="http://127.0.0.1:9", node_token="tok", stop_timeout_s=5,
                         id_factory=lambda pool: next(ids))
    try:
        assert await prov.start_hosts("p1", 2) == ["p1-a", "p1-b"]
        assert await prov.list_hosts("p1") == ["p1-a", "p1-b"] and await prov.list_hosts("p2") == []
        pid = prov.nodes["p1-a"].proc.pid
        assert os.getpgid(pid) == pid  # its own process group: a stop reaches its children
        assert cmdline(pid)[3:6] == [b"p1", b"p1-a", b"http://127.0.0.1:9"]  # placeholders substituted
        await prov.stop_host("p1", "p1-a")
        assert not alive(pid) and await prov.list_hosts("p1") == ["p1-b"]
        await prov.stop_host("p1", "p1-a")  # unknown now: a no-op
        other = prov.nodes["p1-b"].proc.pid
    finally:
        await prov.close()
    assert not alive(other) and prov.nodes == {}


async def test_local_provider_kills_a_node_that_ignores_sigterm_and_its_children(tmp_path: Path) -> None:
    prov = LocalProvider(STUBBORN, broker_url="u", node_token="t", stop_timeout_s=0.5, log_dir=str(tmp_path))
    try:
        [host] = await prov.start_hosts("p1", 1)
        log_path = tmp_path / f"{host}.log"
        await until(lambda: log_path.read_text().strip() != "", "the node to print its child's pid")
        grandchild = int(log_path.read_text().split()[0])
        leader = prov.nodes[host].proc.pid
        assert alive(grandchild) and alive(leader)
        await prov.stop_host("p1", host)
        assert not alive(leader)
        await until(lambda: not alive(grandchild), "the grandchild to be killed with the group")
    finally:
        await prov.close()


async def test_local_provider_forgets_a_node_that_exited_and_reports_spawn_failures() -> None:
    prov = LocalProvider([sys.executable, "-c", "pass"], broker_url="u", node_token="t")
    [host] = await prov.start_hosts("p1", 1)
    await prov.nodes[host].proc.wait()
    assert await prov.list_hosts("p1") == []
    bad = LocalProvider(["/nonexistent/render-node"], broker_url="u", node_token="t")
    with pytest.raises(ProviderError):
        await bad.start_hosts("p1", 1)
    await prov.close()
    await bad.close()


def test_argv_template_and_host_ids() -> None:
    argv = build_argv(DEFAULT_NODE_COMMAND, {"python": "/py", "broker_url": "http://b:8080", "node_token": "nt",
                                             "pool": "gpu", "host_id": "gpu-1"})
    assert argv == ["/py", "-m", "streamer", "--broker-url", "http://b:8080", "--node-token=nt", "--pool", "gpu",
                    "--host-id", "gpu-1"]
    assert build_argv(["{x}", "{pool}"], {"pool": "p"}) == ["{x}", "p"]  # unknown braces are kept
    # a token that starts with "-" (secrets.token_urlsafe makes those) still reaches the node as its value
    from streamer.node.settings import load as load_node_settings

    dashed = build_argv(DEFAULT_NODE_COMMAND, {"python": "/py", "broker_url": "http://b:8080", "node_token": "-x-Y",
                                               "pool": "gpu", "host_id": "gpu-1"})
    node = load_node_settings(dashed[3:], {})
    assert (node.node_token, node.pool, node.host_id) == ("-x-Y", "gpu", "gpu-1")
    hid = new_host_id("a" * 63)
    assert len(hid) <= 63 and hid.startswith("a") and hid != new_host_id("a" * 63)


async def test_static_provider_cannot_start_or_stop() -> None:
    prov = StaticProvider()
    assert not prov.can_start and not await prov.can_stop("p", "h") and await prov.list_hosts("p") == []
    with pytest.raises(ProviderError):
        await prov.start_hosts("p", 1)
    with pytest.raises(ProviderError):
        await prov.stop_host("p", "h")


def test_provider_from_settings() -> None:
    assert isinstance(provider_from_settings(BrokerSettings()), StaticProvider)
    local = provider_from_settings(BrokerSettings(host_provider="local", host="0.0.0.0", port=8123, node_token="n"))
    assert isinstance(local, LocalProvider) and local.broker_url == "http://127.0.0.1:8123"
    assert local.command == DEFAULT_NODE_COMMAND
    k8s = provider_from_settings(BrokerSettings(host_provider="kubernetes", kubernetes_namespace="gpu",
                                                kubernetes_workload_kind="statefulset"))
    assert isinstance(k8s, KubernetesProvider) and (k8s.namespace, k8s.kind) == ("gpu", "statefulset")
    with pytest.raises(ValueError):
        provider_from_settings(BrokerSettings(host_provider="cloud"))
    with pytest.raises(ValueError):
        KubernetesProvider(kind="daemonset")


# --- kubernetes: the bodies it would send -------------------------------------------------------


def pod(name: str, phase: str = "Running", ready: bool = True, node: str | None = "gpu-node-1",
        cost: str | None = None, deleting: bool = False) -> dict:
    meta: dict = {"name": name, "annotations": {POD_DELETION_COST: cost} if cost is not None else None}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pod_info_parses_the_api_json() -> None:
    p = PodInfo.from_dict(pod("rn-abc", cost="-5"))
    assert (p.name, p.phase, p.ready, p.scheduled, p.terminating, p.deletion_cost) == (
        "rn-abc", "Running", True, True, False, -5)
    q = PodInfo.from_dict({"metadata": {"name": "x", "annotations": {POD_DELETION_COST: "junk"}}})
    assert (q.phase, q.ready, q.scheduled, q.deletion_cost) == ("Unknown", False, False, None)


def test_scale_and_annotation_patches() -> None:
    assert scale_patch(3) == {"spec": {"replicas": 3}}
    assert scale_patch(2, "991") == {"spec": {"replicas": 2}, "metadata": {"resourceVersion": "991"}}
    with pytest.raises(ValueError):
        scale_patch(-1)
    assert deletion_cost_patch(LOWEST_DELETION_COST) == {
        "metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-2147483648"}}}
    assert deletion_cost_patch(None) == {"metadata": {"annotations": {POD_DELETION_COST: None}}}  # removes it
    with pytest.raises(ValueError):
        deletion_cost_patch(2**31)
    assert label_selector({"pool": "p1", "app": "render-node"}) == "app=render-node,pool=p1"
    assert workload_name("render-node-{pool}", "gpu") == "render-node-gpu"


def test_deployment_scale_down_only_when_the_drained_pod_is_the_one_removed() -> None:
    pods = [PodInfo.from_dict(pod(n)) for n in ("rn-a", "rn-b", "rn-c")]
    assert deployment_stop_blocker(pods, "rn-b") is None
    assert "not a live pod" in (deployment_stop_blocker(pods, "rn-z") or "")
    # the ReplicaSet controller deletes unscheduled / pending / not-ready pods before looking at the cost
    for bad in (pod("rn-d", node=None, phase="Pending", ready=False), pod("rn-d", phase="Pending", ready=False),
                pod("rn-d", ready=False)):
        assert "would be deleted first" in (deployment_stop_blocker([*pods, PodInfo.from_dict(bad)], "rn-b") or "")
    tie = PodInfo.from_dict(pod("rn-d", cost=str(LOWEST_DELETION_COST)))
    assert "lowest deletion cost" in (deployment_stop_blocker([*pods, tie], "rn-b") or "")
    leaving = PodInfo.from_dict(pod("rn-d", deleting=True))
    assert "terminating" in (deployment_stop_blocker([*pods, leaving], "rn-b") or "")
    # the target itself may be anything (it is drained and empty): it is the one we want gone
    odd = [*pods[:2], PodInfo.from_dict(pod("rn-c", ready=False))]
    assert deployment_stop_blocker(odd, "rn-c") is None
    assert pending_pods(5, [*pods, leaving]) == 2


def test_statefulset_scales_down_by_highest_ordinal_only() -> None:
    assert statefulset_ordinal("rn", "rn-12") == 12 and statefulset_ordinal("rn", "other-1") is None
    assert statefulset_stop_blocker("rn", 3, "rn-2") is None
    assert "highest ordinal" in (statefulset_stop_blocker("rn", 3, "rn-0") or "")
    assert "not a pod" in (statefulset_stop_blocker("rn", 3, "x-2") or "")
    assert statefulset_new_ids("rn", 3, 2) == ["rn-3", "rn-4"]


async def test_kubernetes_provider_without_the_client_package_fails_cleanly() -> None:
    try:
        import kubernetes_asyncio  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("kubernetes_asyncio is installed; this checks the error without it")
    with pytest.raises(ProviderError, match="kubernetes_asyncio"):
        await KubernetesProvider().list_hosts("p1")
    await KubernetesProvider().close()


async def test_broker_shutdown_stops_the_local_nodes_it_started(aiohttp_client, settings_factory, clock) -> None:
    from broker.app import create_app
    from broker.http.plans import SCALER

    settings = settings_factory(host_provider="local", local_node_command=SLEEPER, local_stop_timeout_s=5,
                                autoscale_interval_s=0)
    client = await aiohttp_client(create_app(settings, clock=clock))
    prov = client.app[SCALER].provider
    assert isinstance(prov, LocalProvider) and prov.broker_url == f"http://127.0.0.1:{settings.port}"
    await prov.start_hosts("p1", 2)
    pids = [n.proc.pid for n in prov.nodes.values()]
    assert all(alive(p) for p in pids)
    await client.close()  # the app's cleanup context closes the provider
    assert not any(alive(p) for p in pids) and prov.nodes == {}
