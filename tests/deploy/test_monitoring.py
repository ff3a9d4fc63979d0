"""The monitoring component: what a stock kube-prometheus-stack picks up, and the dashboard's region and tier.

``deploy/kubernetes/components/monitoring`` is added to each overlay (as
docs/deploy.md says to) and rendered by ``kubectl kustomize``; the
inference-gateway overlay uses it already. Checked: every object against its
published fields (ServiceMonitor, PodMonitor, PrometheusRule: the
prometheus-operator v0.93.0 CRDs, :mod:`tests.deploy.published`), with broken
ones that must fail; the ``release`` label the chart's selectors ask for, set
in the component's one place and absent without it; every metrics port of
every pod scraped by exactly one monitor whose selectors reach it (proxy
workers up to the ports the PodMonitor lists); the pods' region and model
labels copied onto their series; the dashboard's ``region`` and ``tier``
variables defined on those labels and used by the panels.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataplane import workers
from tests.deploy import kube, published
from tests.deploy.conftest import KUBE, find
from tools import deploysync

COMPONENT = "components/monitoring"
OVERLAYS = ("overlays/single-region", "overlays/three-regions")
MONITORS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
VERSIONS = ("1.30.0", "1.37.0")
CERT_MANAGER = {"Issuer", "Certificate"}


def with_component(kube_dir: Path, overlay: str) -> Path:
    """A kustomization of ``overlay`` with the component, as an operator writes it (docs/deploy.md)."""
    directory = kube_dir / f"monitored-{overlay.rpartition('/')[2]}"
    directory.mkdir(exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../{overlay}"], "components": [f"../{COMPONENT}"]}))
    return directory


@pytest.fixture(scope="module")
def renders(kube_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each overlay with the component, the inference-gateway overlay (which has it) and single-region without it."""
    out = {o: kube.render(with_component(kube_dir, o)) for o in OVERLAYS}
    out["overlays/inference-gateway"] = kube.render(kube_dir / "overlays/inference-gateway")
    out["without"] = kube.render(kube_dir / OVERLAYS[0])
    return out


WITH = (*OVERLAYS, "overlays/inference-gateway")


def release() -> str:
    """The release label's value, from the component's one place."""
    component = yaml.safe_load((KUBE / COMPONENT / "kustomization.yaml").read_text())
    (patch,) = [p for p in component["patches"] if p["target"] == {"group": "monitoring.coreos.com"}]
    (op,) = yaml.safe_load(patch["patch"])
    assert op["path"] == "/metadata/labels/release"
    return str(op["value"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In / NotIn / Exists / DoesNotExist) on ``labels``."""
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present, within = key in labels, labels.get(key) in values
        ok = ok and {"In": within, "NotIn": not within, "Exists": present, "DoesNotExist": not present}[operator]
    return ok


def metrics_ports(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template, container port) of every port named for metrics, in every workload."""
    return [(o["spec"]["template"], port) for o in objects if o["kind"] in ("Deployment", "StatefulSet")
            for c in o["spec"]["template"]["spec"]["containers"] for port in c.get("ports", [])
            if "metrics" in port.get("name", "")]


def scrapers(objects: list[dict[str, Any]], pod: dict[str, Any], port: dict[str, Any]) -> list[str]:
    """The monitors (and endpoints) that scrape ``port`` of pods like ``pod``, as the Prometheus Operator finds them."""
    labels = pod["metadata"]["labels"]
    found = []
    for monitor in (o for o in objects if o["kind"] == "PodMonitor"):
        if selects(monitor["spec"]["selector"], labels):
            found += [f"PodMonitor/{monitor['metadata']['name']}/{e.get('port', e.get('portNumber'))}"
                      for e in monitor["spec"].get("podMetricsEndpoints", [])
                      if e.get("port") == port["name"] or e.get("portNumber") == port["containerPort"]]
    services = [o for o in objects if o["kind"] == "Service" and o["spec"].get("selector")
                and selects({"matchLabels": o["spec"]["selector"]}, labels)]
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        for service in services:
            if not selects(monitor["spec"]["selector"], service["metadata"].get("labels", {})):
                continue
            names = {p["name"] for p in service["spec"]["ports"]
                     if p.get("targetPort") in (port["name"], port["containerPort"])}
            found += [f"ServiceMonitor/{monitor['metadata']['name']}/{service['metadata']['name']}/{e['port']}"
                      for e in monitor["spec"]["endpoints"] if e.get("port") in names]
    return found


# -- the published fields -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", WITH)
def test_every_object_validates_against_its_published_api(renders, overlay, version) -> None:
    objects = renders[overlay]
    # cert-manager's Issuer and Certificate have no schema here: test_manifests checks their fields by hand
    checked = [o for o in objects if o["kind"] not in CERT_MANAGER]
    assert published.all_errors(checked, version) == []
    assert {o["kind"] for o in objects} >= MONITORS
    for rule in (o for o in objects if o["kind"] == "PrometheusRule"):
        names = [g["name"] for g in rule["spec"]["groups"]]
        assert len(names) == len(set(names))  # x-kubernetes-list-map-keys: name


BROKEN = [
    ("service-monitor-field-misspelt", "ServiceMonitor", lambda s: s.update(podTargetLabel=["ferry/region"]),
     "podTargetLabel"),
    ("service-monitor-without-endpoints", "ServiceMonitor", lambda s: s.pop("endpoints"), "endpoints"),
    ("service-monitor-interval-malformed", "ServiceMonitor", lambda s: s["endpoints"][0].update(interval="15 s"),
     "interval"),
    ("pod-monitor-without-selector", "PodMonitor", lambda s: s.pop("selector"), "selector"),
    ("pod-monitor-port-number-zero", "PodMonitor", lambda s: s["podMetricsEndpoints"][0].update(portNumber=0),
     "portNumber"),
    ("pod-monitor-target-labels-not-a-list", "PodMonitor", lambda s: s.update(podTargetLabels="ferry/region"),
     "podTargetLabels"),
    ("rule-without-expr", "PrometheusRule", lambda s: s["groups"][0]["rules"][0].pop("expr"), "expr"),
    ("rule-group-without-name", "PrometheusRule", lambda s: s["groups"][0].pop("name"), "name"),
]


@pytest.mark.parametrize(("kind", "breaks", "field"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_broken_monitor_fails_naming_its_field(renders, kind, breaks, field) -> None:
    good = next(o for o in renders[OVERLAYS[0]] if o["kind"] == kind)
    assert published.errors(good) == []
    broken = copy.deepcopy(good)
    breaks(broken["spec"])
    found = published.errors(broken)
    assert found and any(field in e for e in found), found


# -- what a stock Prometheus picks up ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", WITH)
def test_every_monitor_carries_the_release_label_the_chart_selects(renders, overlay) -> None:
    monitors = [o for o in renders[overlay] if o["kind"] in MONITORS]
    assert {o["kind"] for o in monitors} == MONITORS
    assert all(o["metadata"]["labels"].get("release") == release() for o in monitors)
    # and only them: the label is for the chart's selectors, not the workloads
    others = [o for o in renders[overlay] if o["kind"] not in MONITORS]
    assert not [o for o in others if "release" in o["metadata"].get("labels", {})]


def test_without_the_component_no_monitor_has_it(renders) -> None:
    monitors = [o for o in renders["without"] if o["kind"] in MONITORS]
    assert monitors and not [o for o in monitors if "release" in o["metadata"]["labels"]]
    assert not [o for o in renders["without"] if o["kind"] == "PodMonitor"]


@pytest.mark.parametrize("overlay", WITH)
def test_every_metrics_port_of_every_pod_is_scraped_once(renders, overlay) -> None:
    objects = renders[overlay]
    ports = metrics_ports(objects)
    names = {p["name"] for _, p in ports}
    assert {"metrics", "triton-metrics"} <= names, names  # Ferry's own and the engine's
    missed = {}
    for pod, port in ports:
        found = scrapers(objects, pod, port)
        if len(found) != 1:
            missed[(pod["metadata"]["labels"].get("app.kubernetes.io/component"), port["name"])] = found
    assert missed == {}


def test_the_scrape_check_sees_a_port_no_monitor_scrapes(renders) -> None:
    objects = copy.deepcopy(renders[OVERLAYS[0]])
    triton = find(objects, "Deployment", "triton")["spec"]["template"]
    port = next(p for c in triton["spec"]["containers"] for p in c["ports"] if p["name"] == "triton-metrics")
    assert len(scrapers(objects, triton, port)) == 1
    assert scrapers(objects, triton, {"name": "engine-metrics", "containerPort": 8102}) == []
    # without the component, the engines' and the proxies' metrics are not scraped at all
    plain = renders["without"]
    triton = find(plain, "Deployment", "triton")["spec"]["template"]
    assert scrapers(plain, triton, port) == []


@pytest.mark.parametrize("overlay", WITH)
def test_every_proxy_worker_port_is_declared_and_listed(renders, overlay) -> None:
    objects = renders[overlay]
    monitor = find(objects, "PodMonitor", "ferry-proxy")["spec"]
    listed = [e["port"] for e in monitor["podMetricsEndpoints"]]
    assert listed == ["metrics", *(f"metrics-{k}" for k in range(2, len(listed) + 1))]
    for proxy in (o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("proxy")):
        (container,) = proxy["spec"]["template"]["spec"]["containers"]
        count = int(next(a for a in container["args"] if a.startswith("--workers=")).partition("=")[2])
        assert 1 <= count <= len(listed)
        listen = next(a for a in container["args"] if a.startswith("--metrics-listen=")).partition("=")[2]
        declared = {p["name"]: p["containerPort"] for p in container["ports"] if "metrics" in p["name"]}
        # worker k serves on the port dataplane.workers gives it, declared under the k-th name listed
        assert declared == {listed[k - 1]: int(workers.metrics_address(listen, k).rpartition(":")[2])
                            for k in range(1, count + 1)}


@pytest.mark.parametrize("overlay", WITH)
def test_the_pods_region_and_model_labels_reach_their_series(renders, overlay) -> None:
    objects = renders[overlay]
    monitors = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert all("ferry/region" in m["spec"]["podTargetLabels"] for m in monitors)
    assert "ferry/model" in find(objects, "ServiceMonitor", "ferry")["spec"]["podTargetLabels"]
    assert "ferry/model" in find(objects, "PodMonitor", "ferry-engines")["spec"]["podTargetLabels"]
    # every pod of a region carries its region
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].startswith(("proxy", "envoy", "triton", "picker")):
            assert obj["spec"]["template"]["metadata"]["labels"]["ferry/region"], obj["metadata"]["name"]


# -- the dashboard ---------------------------------------------------------------------------------------------------


def prometheus_label(pod_label: str) -> str:
    """The Prometheus Operator's name for a pod label copied by podTargetLabels (invalid characters to ``_``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def test_the_dashboard_filters_by_region_and_tier() -> None:
    dashboard = json.loads(deploysync.DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    region, tier = variables["region"], variables["tier"]
    assert region["query"] == f"label_values(ferry_proxy_requests_total, {prometheus_label('ferry/region')})"
    assert tier["query"] == "label_values(ferry_proxy_requests_total, tier)"
    # "All" matches series without the label too (a fleet scraped without podTargetLabels)
    assert all(v["includeAll"] and v["allValue"] == ".*" for v in (region, tier))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any('ferry_region=~"$region"' in e for e in exprs)
    assert any('region=~"$region"' in e.replace('ferry_region=~"$region"', "") for e in exprs)
    assert any('tier=~"$tier"' in e for e in exprs)
    # every selector of a proxy metric filters on the pod's region
    proxy_selectors = re.findall(r"\bferry_proxy_[a-z0-9_]+(\{[^}]*\})?", " ".join(exprs))
    assert proxy_selectors and all('ferry_region=~"$region"' in s for s in proxy_selectors)
    # no variable is defined and left unused
    used = " ".join(exprs)
    assert all(f"${name}" in used for name in variables if name != "datasource")
