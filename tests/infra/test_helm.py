"""The Helm chart (infra/helm/render-broker), rendered offline and validated.

No ``helm`` binary is installable from the registries this project reaches, so the chart is
rendered by infra/helm/render.py (the Go-template subset the chart uses; anything else is refused)
and every built-in object is checked against Kubernetes' own OpenAPI schemas by the
``kubernetes-validate`` package, strictly (unknown fields fail), at the pinned versions below.
The ServiceMonitor (a CRD) is checked by hand.  Where a ``helm`` binary exists, the last test
compares its ``helm template`` output with ours.  No cluster is involved.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from broker.autoscale.providers import KUBERNETES_RBAC, workload_name
from broker.settings import BrokerSettings
from rbcommon.settings import load as load_settings
from streamer.node.settings import load as load_node_settings
from tests.infra.coturn import coturn_accepts, needs_turnserver

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "render-broker"
K8S_VERSIONS = ("1.29.0", "1.33.0")  # pinned schema versions (kubernetes-validate ships them offline)
_spec = importlib.util.spec_from_file_location("helm_render", ROOT / "infra" / "helm" / "render.py")
assert _spec and _spec.loader
render = importlib.util.module_from_spec(_spec)
sys.modules["helm_render"] = render
_spec.loader.exec_module(render)

SECRETS = {"adminToken": "adm", "nodeToken": "nod", "secret": "hmac", "turnSecret": "turn",
           "databaseUrl": "postgresql://rb:pw@pg:5432/rb"}
BASE = {"secrets": SECRETS,
        "nodePools": [{"name": "desktop", "replicas": 2, "gpus": 1, "shutdownGraceS": 300, "nodeSelector": {},
                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                       "resources": {"requests": {"cpu": "4"}, "limits": {"memory": "16Gi"}}, "env": {}},
                      {"name": "game", "replicas": 0, "gpus": 2, "shutdownGraceS": 60,  # no optional keys
                       "env": {"NODE_SEATS": "4"}}]}
VARIANTS: dict[str, dict[str, Any]] = {
    "deployment": {},
    "statefulset": {"nodeKind": "StatefulSet"},
    "sentinel-no-turn-no-hpa": {"broker": {"redisSentinels": ["s0:26379", "s1:26379"], "hpa": {"enabled": False}},
                                "turn": {"enabled": False}, "serviceMonitor": {"enabled": False},
                                "secrets": {"turnSecret": ""}},
    "existing-secret": {"secrets": {"existingSecret": "mine", "adminToken": ""}},
}


def rendered(variant: str = "deployment", release: str = "rb", namespace: str = "gpu") -> list[dict[str, Any]]:
    values = render.merge_values(BASE, VARIANTS[variant])
    return [doc for _name, doc in render.render_chart(CHART, values, release=release, namespace=namespace)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container_env(container: dict[str, Any], secret: dict[str, str], field_values: dict[str, str]) -> dict[str, str]:
    """The environment a container starts with (envFrom a Secret, then env; fieldRefs from field_values)."""
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        assert src["secretRef"]["name"] in ("rb-secrets", "mine")
        env.update(secret)
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[e["name"]] = secret[e["valueFrom"]["secretKeyRef"]["key"]]
    return env


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schema(variant: str, version: str) -> None:
    docs = rendered(variant)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: test_service_monitor_scrapes_the_admin_listener
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_would_catch_a_mistake() -> None:
    broker = one(rendered(), "Deployment", "rb-broker")
    broker["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(broker, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize(("bad", "where"), [
    ({"nodeKind": "DaemonSet"}, "nodeKind"),
    ({"nodePools": [{"name": "Bad_Pool", "replicas": 1, "gpus": 1, "shutdownGraceS": 60}]}, "nodePools.0.name"),
    ({"nodePools": [{"name": "p", "replicas": 1, "gpus": 1, "shutdownGraceS": 60, "gpu": 2}]}, "nodePools.0"),
    ({"broker": {"env": {"NODE_SEATS": "2"}}}, "broker.env"),
    ({"broker": {"redisSentinels": ["s0"]}}, "broker.redisSentinels.0"),
    ({"turn": {"externalIp": "turn.example.com"}}, "turn.externalIp"),
])
def test_values_schema_refuses_bad_values_naming_the_field(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(render.TemplateError, match=rf"values.schema.json: {re.escape(where)}: "):
        render.render_chart(CHART, render.merge_values(BASE, bad))


def test_default_values_refuse_to_render_without_secrets() -> None:
    with pytest.raises(render.TemplateError, match=r"secret.yaml: required value missing: secrets.adminToken"):
        render.render_chart(CHART)


@pytest.mark.parametrize("variant", ["deployment", "statefulset"])
def test_role_grants_exactly_what_the_kubernetes_provider_calls(variant: str) -> None:
    docs = rendered(variant)
    role = one(docs, "Role", "rb-broker")
    granted = {(verb, group, res) for rule in role["rules"] for verb in rule["verbs"]
               for group in rule["apiGroups"] for res in rule["resources"]}
    kind = "statefulsets" if variant == "statefulset" else "deployments"
    needed = {r for r in KUBERNETES_RBAC if r[2] in (f"{kind}/scale", "pods")}
    if variant == "statefulset":
        needed.discard(("patch", "", "pods"))  # pod-deletion-cost is a Deployment-mode step
    assert granted == needed
    assert not any("*" in str(rule) for rule in role["rules"])
    workloads = sorted(d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                       and d["metadata"]["labels"].get("app.kubernetes.io/name") == "render-node")
    [scale_rule] = [r for r in role["rules"] if r["apiGroups"] == ["apps"]]
    assert sorted(scale_rule["resourceNames"]) == workloads == ["rb-node-desktop", "rb-node-game"]
    binding = one(docs, "RoleBinding", "rb-broker")
    broker = one(docs, "Deployment", "rb-broker")
    pdb = one(docs, "PodDisruptionBudget", "rb-broker")
    assert pdb["spec"]["selector"]["matchLabels"] == broker["spec"]["selector"]["matchLabels"]
    assert binding["roleRef"]["name"] == "rb-broker"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": broker["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": "gpu"}]


def test_both_modes_together_grant_every_request_the_provider_makes() -> None:
    granted = set()
    for variant in ("deployment", "statefulset"):
        for rule in one(rendered(variant), "Role", "rb-broker")["rules"]:
            granted |= {(v, g, r) for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == set(KUBERNETES_RBAC)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_broker_settings_load_and_point_the_provider_at_the_node_workloads(variant: str) -> None:
    docs = rendered(variant)
    secret = ({"BROKER_NODE_TOKEN": "x", "BROKER_TURN_SECRET": "y"} if variant == "existing-secret"
              else one(docs, "Secret", "rb-secrets")["stringData"])
    broker = one(docs, "Deployment", "rb-broker")
    [c] = broker["spec"]["template"]["spec"]["containers"]
    env = container_env(c, secret, {"metadata.namespace": "gpu"})
    s, _ = load_settings(BrokerSettings, [], env, "BROKER_")
    assert s.host_provider == "kubernetes" and s.kubernetes_namespace == "gpu"
    workload_kind = "StatefulSet" if variant == "statefulset" else "Deployment"
    assert s.kubernetes_workload_kind == workload_kind.lower()
    for pool in ("desktop", "game"):
        node = one(docs, workload_kind, workload_name(s.kubernetes_workload, pool))
        assert node["spec"]["template"]["metadata"]["labels"]["render-broker/pool"] == pool
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert s.port == ports["http"] and s.admin_listen == f"0.0.0.0:{ports['admin']}"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    if variant == "sentinel-no-turn-no-hpa":
        assert s.redis_sentinels == ["s0:26379", "s1:26379"] and s.turn_urls == []
        assert broker["spec"]["replicas"] == 2 and not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
        assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    else:
        assert s.turn_urls == ["turn:rb-turn.gpu.svc:3478?transport=udp", "turn:rb-turn.gpu.svc:3478?transport=tcp"]
        hpa = one(docs, "HorizontalPodAutoscaler", "rb-broker")
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "rb-broker"}
        assert "replicas" not in broker["spec"]  # the HPA owns the count
    if variant == "existing-secret":
        assert not [d for d in docs if d["kind"] == "Secret"]
    else:
        assert (s.admin_token, s.node_token, s.secret) == ("adm", "nod", "hmac")


@pytest.mark.parametrize("variant", ["deployment", "statefulset"])
def test_node_pods_grace_gpus_and_probes_match_the_node_settings(variant: str) -> None:
    docs = rendered(variant)
    secret = one(docs, "Secret", "rb-secrets")["stringData"]
    values = render.merge_values(yaml.safe_load((CHART / "values.yaml").read_text()), BASE)
    for pool in BASE["nodePools"]:
        kind = "StatefulSet" if variant == "statefulset" else "Deployment"
        w = one(docs, kind, f"rb-node-{pool['name']}")
        spec = w["spec"]["template"]["spec"]
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        [c] = spec["containers"]
        env = container_env(c, secret, {"metadata.name": f"rb-node-{pool['name']}-0", "status.podIP": "10.1.2.3"})
        ns = load_node_settings([], env)
        assert (ns.pool, ns.host_id, ns.node_token, ns.broker_url) == (
            pool["name"], f"rb-node-{pool['name']}-0", "nod", "http://rb-broker")
        # graceful rollout: the kubelet's grace covers preStop, the node's own drain grace and a margin
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre[0] == "sleep" and "kill" not in " ".join(pre)  # a second SIGTERM would stop the node at once
        assert spec["terminationGracePeriodSeconds"] == int(pre[1]) + ns.shutdown_grace_s + values["stopMarginS"]
        assert spec["terminationGracePeriodSeconds"] > ns.shutdown_grace_s == pool["shutdownGraceS"]
        res = c["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == pool["gpus"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ns.health_port == ports["health"]
        assert c["livenessProbe"]["httpGet"] == c["readinessProbe"]["httpGet"] == {"path": "/healthz",
                                                                                    "port": "health"}
        assert spec["automountServiceAccountToken"] is False
        if variant == "statefulset":
            assert one(docs, "Service", w["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    game = one(docs, "StatefulSet" if variant == "statefulset" else "Deployment", "rb-node-game")
    assert {"name": "NODE_SEATS", "value": "4"} in game["spec"]["template"]["spec"]["containers"][0]["env"]


def test_turn_server_shares_the_brokers_secret_and_port() -> None:
    docs = rendered()
    turn = one(docs, "Deployment", "rb-turn")
    [c] = turn["spec"]["template"]["spec"]["containers"]
    assert "--use-auth-secret" in c["args"] and "--static-auth-secret=$(TURN_SECRET)" in c["args"]
    [ref] = [e["valueFrom"]["secretKeyRef"] for e in c["env"] if e["name"] == "TURN_SECRET"]
    assert ref == {"name": "rb-secrets", "key": "BROKER_TURN_SECRET"}
    svc = one(docs, "Service", "rb-turn")
    assert {(p["port"], p["protocol"]) for p in svc["spec"]["ports"]} == {(3478, "UDP"), (3478, "TCP")}
    assert "--listening-port=3478" in c["args"] and "--no-tcp-relay" in c["args"]
    extra = turn_args({"turn": {"extraArgs": ["--denied-peer-ip=10.96.0.0-10.111.255.255"]}})
    assert extra[-1] == "--denied-peer-ip=10.96.0.0-10.111.255.255"
    assert svc["spec"]["selector"].items() <= turn["spec"]["template"]["metadata"]["labels"].items()


NAT_EXTERNAL_IP = "203.0.113.10/10.0.0.5"  # turn.externalIp: a public address mapped 1:1 onto the private one


def turn_args(values: dict[str, Any]) -> list[str]:
    docs = render.render_chart(CHART, render.merge_values(BASE, values), release="rb", namespace="gpu")
    [turn] = [d for _n, d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rb-turn"]
    [c] = turn["spec"]["template"]["spec"]["containers"]
    return list(c["args"])


def test_turn_external_ip_becomes_coturns_external_ip() -> None:
    assert not [a for a in turn_args({}) if a.startswith("--external-ip")]  # by default the host's own address
    args = turn_args({"turn": {"externalIp": NAT_EXTERNAL_IP}})
    assert [a for a in args if a.startswith("--external-ip")] == [f"--external-ip={NAT_EXTERNAL_IP}"]
    assert turn_args({"turn": {"externalIp": "203.0.113.10"}}).count("--external-ip=203.0.113.10") == 1


@needs_turnserver
async def test_coturn_accepts_the_charts_arguments(unused_tcp_port_factory) -> None:
    args = [a.replace("$(TURN_SECRET)", "turn") for a in turn_args({"turn": {"externalIp": NAT_EXTERNAL_IP}})]
    await coturn_accepts(args, unused_tcp_port_factory())  # $(TURN_SECRET) expanded as the kubelet would


def test_service_monitor_scrapes_the_admin_listener() -> None:
    docs = rendered()
    sm = one(docs, "ServiceMonitor", "rb-broker")
    svc = one(docs, "Service", "rb-broker")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    [ep] = sm["spec"]["endpoints"]
    assert ep["path"] == "/metrics" and ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["port"] == "admin"  # /metrics is only served on the admin listener
    assert svc["spec"]["selector"].items() <= one(docs, "Deployment", "rb-broker")["spec"]["template"][
        "metadata"]["labels"].items()


def test_images_and_version_follow_the_project() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == values["images"]["broker"]["tag"] == values["images"]["node"]["tag"] == version
    for role, dockerfile in (("broker", "broker.Dockerfile"), ("node", "render-node.Dockerfile")):
        image = f"{values['images'][role]['repository']}:{version}"
        assert f"-t {image} ." in (ROOT / "infra" / "docker" / dockerfile).read_text()


# --- the renderer itself ----------------------------------------------------------------------------------


def tpl(text: str, values: dict[str, Any] | None = None, defines: str = "") -> str:
    nodes, defs = render.parse(defines + text, "t.yaml")
    ctx = {"Values": values or {}, "Release": {"Name": "r"}}
    return str(render.Renderer(defs).render(nodes, ctx, {"$": ctx}))


def test_renderer_follows_go_template_semantics_for_the_subset() -> None:
    assert tpl("a:\n  {{- if .Values.x }} yes{{ else }} no{{ end }}\n", {"x": 0}) == "a: no\n"
    assert tpl("{{ range $i, $v := .Values.l }}{{ $i }}={{ $v }};{{ end }}", {"l": ["a", "b"]}) == "0=a;1=b;"
    assert tpl("{{ range $k, $v := .Values.m }}{{ $k }}{{ $v }}{{ end }}", {"m": {"b": 2, "a": 1}}) == "a1b2"
    assert tpl("{{ .Values.n | quote }} {{ add 1 .Values.n 3 }} {{ printf \"%s-%v\" .Release.Name 7 }}",
               {"n": 5}) == '"5" 9 r-7'
    assert tpl("x:{{- toYaml .Values.m | nindent 2 }}", {"m": {"k": [1]}}) == "x:\n  k:\n  - 1"
    assert tpl('{{ include "h" . }}', {}, '{{- define "h" -}}<{{ .Release.Name }}>{{- end }}') == "<r>"
    assert tpl("{{ with .Values.w }}{{ .a }}{{ end }}|{{ default \"d\" .Values.none }}", {"w": {"a": 1}}) == "1|d"
    assert tpl("{{ $x := 3 }}{{ $x }}{{/* gone */}}") == "3"
    assert tpl("[{{ .Values.missing }}]") == "[]"  # Helm prints a missing value as nothing
    with pytest.raises(render.TemplateError, match="nil pointer"):
        tpl("{{ .Values.missing.field }}")  # as Go does


@pytest.mark.parametrize("src", ['{{ template "x" . }}', "{{ tpl .Values.a . }}", "{{ .Values.a | sha256sum }}",
                                 "{{ if .Values.a }}", "{{ end }}", "{{ lookup \"v1\" \"Pod\" \"\" \"\" }}"])
def test_renderer_refuses_what_it_does_not_implement(src: str) -> None:
    with pytest.raises(render.TemplateError):
        tpl(src, {"a": "x"})


@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary here (not installable from PyPI/Debian/npm)")
def test_helm_template_renders_the_same_objects(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(BASE))
    out = subprocess.run(["helm", "template", "rb", str(CHART), "--namespace", "gpu", "-f", str(values)],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    theirs = sorted((d["kind"], d["metadata"]["name"], yaml.safe_dump(d)) for d in yaml.safe_load_all(out) if d)
    ours = sorted((d["kind"], d["metadata"]["name"], yaml.safe_dump(d)) for d in rendered())
    assert theirs == ours
