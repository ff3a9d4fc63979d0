"""Every metric the dashboard and the alert rules use is exported by a running fleet."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import grpc

from ferry.v1 import common_pb2, inference_pb2

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "tools/observability/grafana-dashboard.json", ROOT / "tools/observability/prometheus-rules.yml"]
METRIC = re.compile(r"\bferry_[a-z0-9_]+\b")
# labels, not metrics: the pods' ferry/region and ferry/model labels as Prometheus copies them onto the series
# (podTargetLabels of deploy/kubernetes/components/monitoring), which the dashboard's region variable reads
POD_LABELS = {"ferry_region", "ferry_model"}


def used_metrics() -> set[str]:
    return {m for f in FILES for m in METRIC.findall(f.read_text())} - POD_LABELS


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
            "summary": ("_sum", "_count")}


def exported(address: str) -> set[str]:
    """Sample names, plus the series every declared family will have (a labelled family may have no sample yet)."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            base = family.removesuffix("_total")
            names |= {base + suffix for suffix in SUFFIXES.get(kind, ("",))}
    return names


def test_dashboard_is_valid_json_with_panels() -> None:
    dash = json.loads(FILES[0].read_text())
    assert len(dash["panels"]) >= 10 and all(p["targets"] for p in dash["panels"])


def test_every_metric_used_by_dashboard_and_rules_exists(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]})
    with grpc.insecure_channel(fleet.data_plane) as ch:  # some traffic, so labelled series exist
        stub = fleet.inference(ch)
        for tier in (common_pb2.TIER_INTERACTIVE, common_pb2.TIER_STANDARD):
            stub.Infer(inference_pb2.InferRequest(model="chat", prompt="a b", max_tokens=2, tier=tier),
                       metadata=(("x-api-key", fleet.keys["ent"]),), timeout=10)
    names: set[str] = set()
    for child in fleet.children:
        names |= exported(child.ready["metrics"])
    used = used_metrics()
    assert len(used) >= 10
    assert sorted(used - names) == []
    assert not any(n.endswith("_created") for n in names), "no _created twins"
