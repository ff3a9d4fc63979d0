"""The Inference Extension overlay: an InferencePool served by Ferry's picker, an HTTPRoute and an Istio Gateway.

``deploy/kubernetes/overlays/inference-gateway`` is rendered by ``kubectl
kustomize``. Its core objects validate with ``kubernetes-validate`` (strict)
at Kubernetes 1.30 and 1.37, as the other overlays do; the ``InferencePool``,
``HTTPRoute`` and ``Gateway`` against their published v1 fields
(:mod:`tests.deploy.published`: the Inference Extension v1.6.0 CRD, Gateway
API v1.6.1 standard CRDs), with broken objects that must fail. Then the
wiring: the pool's endpoint picker is a Service in front of ``ferry picker``
pods whose flags (parsed by the picker's own parser), ports and probes are
what the picker serves; the pool selects the GPU pods on the port their
agent registers; the route's backend is the pool; NetworkPolicies let the
Gateway's pods reach the picker and the pool's members, and the pickers the
control planes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dataplane import main as proxy_main
from dataplane.epp.servicer import LIVENESS, READINESS
from tests.deploy import kube, published
from tests.deploy.conftest import find

OVERLAY = "overlays/inference-gateway"
VERSIONS = ("1.30.0", "1.37.0")
GATEWAY_KINDS = {"InferencePool", "HTTPRoute", "Gateway"}
GATEWAY_POD_LABEL = "gateway.networking.k8s.io/gateway-name"  # set by Istio on the Gateway's own pods


@pytest.fixture(scope="module")
def objects(kube_dir: Path) -> list[dict[str, Any]]:
    return kube.render(kube_dir / OVERLAY)


def flag(container: dict[str, Any], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(f"--{name}=")]
    assert len(values) <= 1, name
    return values[0] if values else None


def port_of(address: str | None) -> int:
    assert address
    return int(address.rpartition(":")[2])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pods(objects: list[dict[str, Any]], selector: dict[str, str]) -> list[dict[str, Any]]:
    """The workloads whose pod template ``selector`` (matchLabels) selects."""
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")
            and matches(selector, o["spec"]["template"]["metadata"]["labels"])]


# -- the published fields -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_against_its_published_api(objects, version) -> None:
    assert published.all_errors(objects, version) == []
    assert {o["kind"] for o in objects} >= GATEWAY_KINDS


BROKEN = [
    ("pool-without-target-ports", "InferencePool", lambda o: o["spec"].pop("targetPorts"), "targetPorts"),
    ("pool-with-no-target-port", "InferencePool", lambda o: o["spec"].update(targetPorts=[]), "targetPorts"),
    ("pool-target-port-twice", "InferencePool",
     lambda o: o["spec"].update(targetPorts=[{"number": 8001}, {"number": 8001}]), "targetPorts"),
    ("picker-service-without-port", "InferencePool", lambda o: o["spec"]["endpointPickerRef"].pop("port"),
     "endpointPickerRef"),
    ("picker-ref-misspelt", "InferencePool",
     lambda o: o["spec"].update(endpointPickerRef={"name": "picker", "portNumber": 9002}), "endpointPickerRef"),
    ("picker-failure-mode-unknown", "InferencePool",
     lambda o: o["spec"]["endpointPickerRef"].update(failureMode="FailSafe"), "failureMode"),
    ("pool-protocol-unknown", "InferencePool", lambda o: o["spec"].update(appProtocol="grpc"), "appProtocol"),
    ("pool-without-selector", "InferencePool", lambda o: o["spec"].pop("selector"), "selector"),
    ("pool-old-api-version", "InferencePool",
     lambda o: o.update(apiVersion="inference.networking.x-k8s.io/v1alpha2"), "apiVersion"),
    ("route-backend-without-name", "HTTPRoute", lambda o: o["spec"]["rules"][0]["backendRefs"][0].pop("name"),
     "backendRefs"),
    ("route-service-backend-without-port", "HTTPRoute",
     lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(group="", kind="Service"), "backendRefs"),
    ("route-timeout-malformed", "HTTPRoute",
     lambda o: o["spec"]["rules"][0]["timeouts"].update(request="forever"), "timeouts"),
    ("route-field-misspelt", "HTTPRoute", lambda o: o["spec"].update(parentRef=o["spec"]["parentRefs"]),
     "parentRef"),
    ("gateway-without-listeners", "Gateway", lambda o: o["spec"].pop("listeners"), "listeners"),
    ("gateway-listener-without-protocol", "Gateway", lambda o: o["spec"]["listeners"][0].pop("protocol"),
     "protocol"),
    ("gateway-port-zero", "Gateway", lambda o: o["spec"]["listeners"][0].update(port=0), "port"),
]


@pytest.mark.parametrize(("kind", "breaks", "field"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_broken_object_fails_naming_its_field(objects, kind, breaks, field) -> None:
    (good,) = [o for o in objects if o["kind"] == kind]
    assert published.errors(good) == []
    broken = copy.deepcopy(good)
    breaks(broken)
    found = published.errors(broken)
    assert found and any(field in e for e in found), found


# -- the wiring -----------------------------------------------------------------------------------------------------


def test_the_pools_endpoint_picker_is_ferry_picker_on_the_port_it_serves(objects) -> None:
    pool = find(objects, "InferencePool", "chat")["spec"]
    ref = pool["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    # FailOpen would let the Gateway route past authentication, tier queues and quotas
    assert ref["failureMode"] == "FailClose"
    service = find(objects, "Service", ref["name"])
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    (workload,) = pods(objects, service["spec"]["selector"])
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    (container_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == service_port["targetPort"]]
    # the container is `ferry picker`, its flags as the picker's own parser reads them
    assert container["args"][0] == "picker"
    args = proxy_main.parser().parse_args(["--picker", *container["args"][1:]])
    assert port_of(args.listen) == container_port and args.listen.startswith("0.0.0.0:")
    assert args.http_listen == ""  # no HTTP front door: the Gateway serves HTTP
    assert args.picker_end == "stream"  # a Gateway sends no access-log reports: the stream's end ends a request
    assert args.control_plane == "controlplane:7070"
    assert flag(container, "config") == "/etc/ferry/ferry.toml"
    # its health: the endpoint-picker protocol's services, on the gRPC port
    assert container["readinessProbe"]["grpc"] == {"port": container_port, "service": READINESS}
    assert container["livenessProbe"]["grpc"] == {"port": container_port, "service": LIVENESS}
    metrics = port_of(args.metrics_listen)
    assert metrics in {p["containerPort"] for p in container["ports"]}
    assert workload["spec"]["replicas"] >= 2
    pod = workload["spec"]["template"]
    assert pod["metadata"]["labels"]["ferry/region"] == "local"
    assert pod["spec"]["terminationGracePeriodSeconds"] > container["lifecycle"]["preStop"]["sleep"]["seconds"] + 65


def test_the_pool_selects_the_gpu_pods_on_the_port_their_agent_registers(objects) -> None:
    pool = find(objects, "InferencePool", "chat")["spec"]
    (workload,) = pods(objects, pool["selector"]["matchLabels"])
    assert workload["metadata"]["name"] == "triton"
    containers = {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}
    registered = port_of(flag(containers["agent"], "triton"))  # the address the picker names for this replica
    assert [p["number"] for p in pool["targetPorts"]] == [registered]
    assert registered in {p["containerPort"] for p in containers["triton"]["ports"]}
    assert f"--grpc-port={registered}" in containers["triton"]["args"]
    assert pool["appProtocol"] == "kubernetes.io/h2c"  # KServe v2 gRPC
    # the model's name is a model of the catalog the control plane serves
    config = find(objects, "ConfigMap", "ferry-config")["data"]["ferry.toml"]
    assert f'name = "{pool["selector"]["matchLabels"]["ferry/model"]}"' in config


def test_the_route_sends_to_the_pool_through_the_gateway(objects) -> None:
    route = find(objects, "HTTPRoute", "chat")["spec"]
    gateway = find(objects, "Gateway", "inference-gateway")["spec"]
    (parent,) = route["parentRefs"]
    assert (parent["group"], parent["kind"], parent["name"]) == ("gateway.networking.k8s.io", "Gateway",
                                                                 "inference-gateway")
    assert gateway["gatewayClassName"] == "istio"
    assert [(listener["protocol"], listener["allowedRoutes"]["namespaces"]["from"])
            for listener in gateway["listeners"]] == [("HTTP", "Same")]
    (rule,) = route["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    find(objects, "InferencePool", backend["name"])
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]


def admitted(objects: list[dict[str, Any]], target: dict[str, str], peer: dict[str, str], port: int) -> bool:
    """Whether a NetworkPolicy admits pods labelled ``peer`` (same namespace) to ``port`` of pods ``target``."""
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if not matches(spec["podSelector"].get("matchLabels", {}), target):
            continue
        for rule in spec.get("ingress", []):
            if not any(p["port"] == port for p in rule.get("ports", [])):
                continue
            for source in rule.get("from", []):
                selector = source.get("podSelector")
                if selector is None or "namespaceSelector" in source:
                    continue
                ok = matches(selector.get("matchLabels", {}), peer)
                for expression in selector.get("matchExpressions", []):
                    assert expression["operator"] == "In"
                    ok = ok and peer.get(expression["key"]) in expression["values"]
                if ok:
                    return True
    return False


def test_the_gateway_reaches_the_pickers_and_the_pool_and_the_pickers_the_control_planes(objects) -> None:
    gateway_pod = {GATEWAY_POD_LABEL: "inference-gateway"}
    pool = find(objects, "InferencePool", "chat")["spec"]
    picker = find(objects, "Deployment", "picker")["spec"]["template"]["metadata"]["labels"]
    replica = find(objects, "Deployment", "triton")["spec"]["template"]["metadata"]["labels"]
    assert admitted(objects, picker, gateway_pod, pool["endpointPickerRef"]["port"]["number"])
    assert all(admitted(objects, replica, gateway_pod, p["number"]) for p in pool["targetPorts"])
    assert admitted(objects, find(objects, "Deployment", "controlplane")["spec"]["template"]["metadata"]["labels"],
                    picker, 7070)
    # and no one else reaches the pickers' gRPC port
    assert not admitted(objects, picker, {"app.kubernetes.io/component": "proxy"}, 9002)
    assert not admitted(objects, picker, {GATEWAY_POD_LABEL: "another-gateway"}, 9002)
