"""The shipped KEDA ScaledObjects: valid against KEDA's published schema, and aimed at what exists.

Each rendered ScaledObject is validated with ``jsonschema`` against
``schemas/keda-scaledobject.yaml`` (the CRD's openAPIV3Schema of KEDA v2.20.2, strict about unknown
fields; the file says where it comes from). Its Prometheus trigger has the metadata KEDA's
Prometheus scaler requires (``serverAddress``, ``query``, ``threshold``: ``prometheusMetadata`` in
``pkg/scalers/prometheus_scaler.go`` at the same tag); it targets a Deployment of the render that no
HorizontalPodAutoscaler already scales; and its query selects a series that the control plane's own
metrics export: ``ferry_scaling_replicas{kind="desired"}`` of a catalog model and the region of the
pods it scales.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.metrics import Metrics
from ferry.v1 import admin_pb2
from tests.deploy.conftest import find

SCHEMA = yaml.safe_load((Path(__file__).parent / "schemas/keda-scaledobject.yaml").read_text())
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
METRIC_TYPES = {"AverageValue", "Value", "Utilization"}  # the CRD's description of triggers[].metricType
QUERY = re.compile(r"max\((?P<metric>[a-z_]+)\{(?P<labels>[^}]*)\}\)")
MATCHER = re.compile(r'\s*([a-z_]+)="([^"]*)"\s*')
OVERLAYS = ("overlays/single-region", "overlays/three-regions")


def errors(obj: dict[str, Any]) -> list[str]:
    """Where ``obj`` strays from KEDA's ScaledObject schema."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj))


def matchers(query: str) -> tuple[str, dict[str, str]]:
    """The metric and label matchers of ``max(METRIC{k="v", ...})``; the query must be of that form."""
    found = QUERY.fullmatch(query)
    assert found, query
    pairs = [MATCHER.fullmatch(part) for part in found["labels"].split(",")]
    assert all(pairs), query
    return found["metric"], {p[1]: p[2] for p in pairs if p}


def exported(model: str, region: str) -> list[tuple[str, dict[str, str]]]:
    """The series the control plane's metrics export for one planned (model, region): (name, labels)."""
    registry = CollectorRegistry()
    Metrics(registry).observe_scaling([admin_pb2.ScaleView(model=model, region=region, desired=3)], [])
    return [(s.name, s.labels) for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_scaled_object_is_valid_and_scales_a_gpu_deployment_on_its_plan(rendered, overlay) -> None:
    objects = rendered[overlay]
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    gpu_deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"
                       and o["metadata"]["labels"]["app.kubernetes.io/component"] == "replica"}
    hpa_targets = {o["spec"]["scaleTargetRef"]["name"] for o in objects if o["kind"] == "HorizontalPodAutoscaler"}
    catalog = {m["name"] for m in tomllib.loads(
        find(objects, "ConfigMap", "ferry-config")["data"]["ferry.toml"])["models"]}
    assert sorted(o["spec"]["scaleTargetRef"]["name"] for o in scaled) == sorted(gpu_deployments)
    for obj in scaled:
        assert errors(obj) == []
        target = obj["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
        assert target["name"] not in hpa_targets  # KEDA's own HPA would fight another
        assert obj["metadata"]["namespace"] == gpu_deployments[target["name"]]["metadata"]["namespace"]
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] in METRIC_TYPES
        assert set(trigger["metadata"]) >= PROMETHEUS_REQUIRED
        assert float(trigger["metadata"]["threshold"]) == 1.0  # one pod per desired replica
        metric, labels = matchers(trigger["metadata"]["query"])
        region = gpu_deployments[target["name"]]["spec"]["template"]["metadata"]["labels"]["ferry/region"]
        assert labels["kind"] == "desired" and labels["region"] == region and labels["model"] in catalog
        assert (metric, labels) in exported(labels["model"], region)
        assert obj["spec"]["minReplicaCount"] >= 1  # the plan's floor: never to zero


def test_the_schema_refuses_what_keda_would_not_take(rendered) -> None:
    good = find(rendered["overlays/single-region"], "ScaledObject", "triton")
    assert errors(good) == []
    bad = copy.deepcopy(good)
    bad["spec"]["maxReplicas"] = 4  # the HPA's spelling, not KEDA's
    bad["spec"]["minReplicaCount"] = -1
    del bad["spec"]["scaleTargetRef"]["name"]
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 1
    bad["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["window"] = 60
    assert errors(bad) == [
        "spec/advanced/horizontalPodAutoscalerConfig/behavior/scaleDown: Additional properties are not allowed "
        "('window' was unexpected)",
        "spec/minReplicaCount: -1 is less than the minimum of 0",
        "spec/scaleTargetRef: 'name' is a required property",
        "spec/triggers/0/metadata/threshold: 1 is not of type 'string'",
        "spec: Additional properties are not allowed ('maxReplicas' was unexpected)",
    ]
    assert matchers('max(ferry_scaling_replicas{kind="desired", model="m", region="r"})') == (
        "ferry_scaling_replicas", {"kind": "desired", "model": "m", "region": "r"})
    assert ("ferry_scaling_replicas", {"model": "m", "region": "r", "kind": "wanted"}) not in exported("m", "r")
