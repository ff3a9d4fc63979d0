"""Nothing reaches a replica but the data plane: the rendered NetworkPolicies, read and evaluated.

:mod:`tests.deploy.netpol` evaluates Kubernetes NetworkPolicy semantics; it is tested here first on
small hand-written policies (each case allowed or denied for a stated reason), then asked about the
rendered overlays: every container port of every inference pod is named by an ingress rule of a
default-deny policy, and only the proxies and Envoy pods reach the inference ports, only the
monitoring namespace the metrics ports.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.netpol import Cluster, Pod, Port, pods_of, policy_types, ports_match, selects

NS = "app"
DB = Pod("db", NS, {"role": "db"}, (Port(5432, "pg"), Port(53, "dns", "UDP"), Port(8005)))
API = Pod("api", NS, {"role": "api"})
CLIENT = Pod("client", NS, {"role": "client"})
API_ELSEWHERE = Pod("api-2", "other", {"role": "api"})
PROM = Pod("prom", "mon", {"role": "prom"})
MON_OTHER = Pod("mon-other", "mon", {"role": "x"})
PROM_ELSEWHERE = Pod("prom-2", "other", {"role": "prom"})
NAMESPACES = {NS: {}, "other": {}, "mon": {"team": "mon"}}


def policy(name: str, selector: dict[str, Any], ingress: list[Any] | None = None, egress: list[Any] | None = None,
           types: list[str] | None = None, namespace: str = NS) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    if types is not None:
        spec["policyTypes"] = types
    return {"kind": "NetworkPolicy", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def role(value: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {"role": value}}}


DB_SEL = {"matchLabels": {"role": "db"}}
API_ON_PG = policy("api-pg", DB_SEL, [{"from": [role("api")], "ports": [{"port": 5432}]}])
MON_NS = {"namespaceSelector": {"matchLabels": {"team": "mon"}}}
CASES = [
    ("no policy: not isolated", [], CLIENT, DB, 5432, "TCP", True),
    ("selected, no rule: default deny", [policy("deny", DB_SEL, [])], API, DB, 5432, "TCP", False),
    ("a rule for the peer and port", [API_ON_PG], API, DB, 5432, "TCP", True),
    ("the rule's peer, another port", [API_ON_PG], API, DB, 6379, "TCP", False),
    ("the rule's port, another pod", [API_ON_PG], CLIENT, DB, 5432, "TCP", False),
    ("podSelector alone: the policy's namespace only", [API_ON_PG], API_ELSEWHERE, DB, 5432, "TCP", False),
    ("namespaceSelector alone: any pod there", [policy("mon", DB_SEL, [{"from": [MON_NS]}])],
     MON_OTHER, DB, 5432, "TCP", True),
    ("namespaceSelector alone: not another namespace", [policy("mon", DB_SEL, [{"from": [MON_NS]}])],
     PROM_ELSEWHERE, DB, 5432, "TCP", False),
    ("both in one peer: the pod within the namespace",
     [policy("and", DB_SEL, [{"from": [{**MON_NS, **role("prom")}]}])], PROM, DB, 5432, "TCP", True),
    ("both in one peer: another pod of the namespace is out",
     [policy("and", DB_SEL, [{"from": [{**MON_NS, **role("prom")}]}])], MON_OTHER, DB, 5432, "TCP", False),
    ("both in one peer: the pod's labels in another namespace are out",
     [policy("and", DB_SEL, [{"from": [{**MON_NS, **role("prom")}]}])], PROM_ELSEWHERE, DB, 5432, "TCP", False),
    ("two peers: either", [policy("or", DB_SEL, [{"from": [MON_NS, role("api")]}])], API, DB, 5432, "TCP", True),
    ("the union of two policies: the second's rule",
     [API_ON_PG, policy("admin", DB_SEL, [{"from": [role("client")], "ports": [{"port": 22}]}])],
     CLIENT, DB, 22, "TCP", True),
    ("the union of two policies: no rule gives that pair",
     [API_ON_PG, policy("admin", DB_SEL, [{"from": [role("client")], "ports": [{"port": 22}]}])],
     CLIENT, DB, 5432, "TCP", False),
    ("a policy selecting another pod isolates nothing here", [policy("x", {"matchLabels": {"role": "x"}}, [])],
     CLIENT, DB, 5432, "TCP", True),
    ("an empty podSelector selects every pod of its namespace", [policy("all", {}, [])], CLIENT, DB, 5432, "TCP",
     False),
    ("a named port: the pod's port of that name", [policy("n", DB_SEL, [{"ports": [{"port": "pg"}]}])],
     CLIENT, DB, 5432, "TCP", True),
    ("a named port: not another number", [policy("n", DB_SEL, [{"ports": [{"port": "pg"}]}])],
     CLIENT, DB, 5433, "TCP", False),
    ("a named port of another protocol", [policy("n", DB_SEL, [{"ports": [{"port": "dns"}]}])],
     CLIENT, DB, 53, "TCP", False),
    ("a named port with its protocol", [policy("n", DB_SEL, [{"ports": [{"port": "dns", "protocol": "UDP"}]}])],
     CLIENT, DB, 53, "UDP", True),
    ("endPort: inside the range", [policy("r", DB_SEL, [{"ports": [{"port": 8000, "endPort": 8010}]}])],
     CLIENT, DB, 8005, "TCP", True),
    ("endPort: past the range", [policy("r", DB_SEL, [{"ports": [{"port": 8000, "endPort": 8010}]}])],
     CLIENT, DB, 8011, "TCP", False),
    ("a port of another protocol", [policy("u", DB_SEL, [{"ports": [{"port": 5432, "protocol": "UDP"}]}])],
     CLIENT, DB, 5432, "TCP", False),
    ("a rule without ports: every port", [policy("p", DB_SEL, [{"from": [role("api")]}])], API, DB, 9, "TCP", True),
    ("a rule without from: every source", [policy("f", DB_SEL, [{"ports": [{"port": 5432}]}])],
     PROM_ELSEWHERE, DB, 5432, "TCP", True),
    ("an Egress-only policy leaves ingress open", [policy("e", DB_SEL, types=["Egress"])], CLIENT, DB, 5432, "TCP",
     True),
    ("the source's egress default-deny", [policy("e", {"matchLabels": {"role": "client"}}, types=["Egress"])],
     CLIENT, DB, 5432, "TCP", False),
    ("egress rules without policyTypes isolate egress",
     [policy("e", {"matchLabels": {"role": "client"}}, egress=[{"to": [role("api")]}])], CLIENT, DB, 5432, "TCP",
     False),
    ("an egress rule to the target", [policy("e", {"matchLabels": {"role": "client"}}, egress=[{"to": [role("db")]}])],
     CLIENT, DB, 5432, "TCP", True),
    ("In over two values", [policy("in", DB_SEL, [{"from": [{"podSelector": {"matchExpressions": [
        {"key": "role", "operator": "In", "values": ["api", "client"]}]}}]}])], CLIENT, DB, 1, "TCP", True),
    ("NotIn", [policy("notin", DB_SEL, [{"from": [{"podSelector": {"matchExpressions": [
        {"key": "role", "operator": "NotIn", "values": ["client"]}]}}]}])], CLIENT, DB, 1, "TCP", False),
    ("DoesNotExist", [policy("dne", DB_SEL, [{"from": [{"podSelector": {"matchExpressions": [
        {"key": "role", "operator": "DoesNotExist"}]}}]}])], API, DB, 1, "TCP", False),
    ("a pod reaches itself under default deny", [policy("deny", DB_SEL, [])], DB, DB, 5432, "TCP", True),
]


@pytest.mark.parametrize(("policies", "source", "target", "port", "protocol", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_evaluator_on_hand_written_policies(policies, source, target, port, protocol, expected) -> None:
    assert Cluster(policies, NAMESPACES).allowed(source, target, port, protocol) is expected


def test_the_evaluators_parts_and_its_refusals() -> None:
    assert selects({}, {"a": "b"}) and selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""})
    assert not selects({"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "c", "operator": "Exists"}]},
                       {"a": "b"})
    assert policy_types(policy("p", {}, egress=[{}])) == {"Ingress", "Egress"}
    assert policy_types(policy("p", {}, egress=[])) == {"Ingress"}
    assert ports_match([], DB, 1, "TCP")  # an empty list admits every port
    with pytest.raises(ValueError, match="operator"):
        selects({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {})
    with pytest.raises(ValueError, match="needs values"):
        selects({"matchExpressions": [{"key": "a", "operator": "In"}]}, {})
    with pytest.raises(ValueError, match="ipBlock"):
        Cluster([policy("ip", {}, [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}])], NAMESPACES)
    with pytest.raises(ValueError, match="metadata.namespace"):
        Cluster([{"kind": "NetworkPolicy", "metadata": {"name": "n"}, "spec": {"podSelector": {}}}], NAMESPACES)
    with pytest.raises(ValueError, match="not declared"):
        Cluster([policy("mon", DB_SEL, [{"from": [MON_NS]}])], NAMESPACES).allowed(
            Pod("x", "nowhere"), DB, 5432)


# -- the rendered policies ------------------------------------------------------------------------------------------

OVERLAYS = ("overlays/single-region", "overlays/three-regions")
INFERENCE_PORTS = {8000, 8001}  # Triton's HTTP and KServe v2 gRPC (the example pod serves no OpenAI front end)
METRICS_PORTS = {8002, 9091}  # Triton's metrics, the agent's
SCRAPER_NAMESPACE = "monitoring"  # docs/deploy.md, Network policies


def inference_pods(objects: list[dict[str, Any]]) -> list[Pod]:
    return [p for p in pods_of(objects) if p.labels.get("app.kubernetes.io/component") == "replica"]


def rule_names(rule: dict[str, Any], pod: Pod, port: Port) -> bool:
    """Whether one of the rule's ports names ``port`` of ``pod`` (by number or by its name)."""
    return any(entry.get("port") in (port.number, port.name) and entry.get("protocol", "TCP") == port.protocol
               for entry in rule.get("ports") or [])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_port_of_every_inference_pod_is_named_by_a_default_deny_ingress_rule(rendered, overlay) -> None:
    objects = rendered[overlay]
    cluster = Cluster(objects, {"ferry": {}})
    pods = inference_pods(objects)
    assert len(pods) == (1 if overlay.endswith("single-region") else 3)
    for pod in pods:
        governing = cluster.governing(pod, "Ingress")
        assert governing, f"{pod.name}: no Ingress policy selects it"
        assert all(policy["spec"]["policyTypes"] == ["Ingress"] for policy in governing)
        assert {p.number for p in pod.ports} == INFERENCE_PORTS | METRICS_PORTS
        for port in pod.ports:
            rules = [rule for policy in governing for rule in policy["spec"]["ingress"] if rule_names(rule, pod, port)]
            assert rules, f"{pod.name}: port {port.number} ({port.name}) is named by no ingress rule"
            assert all(rule.get("from") for rule in rules), f"{pod.name}: port {port.number} is open to every source"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_data_plane_reaches_a_replica_and_only_the_scraper_its_metrics(rendered, overlay) -> None:
    objects = rendered[overlay]
    cluster = Cluster(objects, {"ferry": {}, SCRAPER_NAMESPACE: {}, "default": {}, "tenant-a": {"team": "a"}})
    pods = pods_of(objects)
    data_plane = [p for p in pods if p.labels.get("app.kubernetes.io/component") in ("proxy", "envoy")]
    others = [p for p in pods if p.labels.get("app.kubernetes.io/component") not in ("proxy", "envoy", "replica")]
    assert {p.name for p in others} >= {"controlplane"}
    scraper = Pod("prometheus-0", SCRAPER_NAMESPACE, {"app.kubernetes.io/name": "prometheus"})
    # a client holding a valid API key, with no route but through the proxies
    outsiders = [
        Pod("client", "ferry", {"app": "client"}),
        Pod("client", "default", {"app": "client"}),
        Pod("unlabelled", "tenant-a", {}),
        # a pod of another namespace that copies a proxy's labels: a podSelector alone stays in ferry
        Pod("fake-proxy", "tenant-a", {"app.kubernetes.io/name": "ferry", "app.kubernetes.io/component": "proxy"}),
        # a pod of ferry's namespace labelled as Ferry but not of the data plane
        Pod("fake-agent", "ferry", {"app.kubernetes.io/name": "ferry", "app.kubernetes.io/component": "replica"}),
        *others,
    ]
    replicas = inference_pods(objects)
    for replica in replicas:
        for port in INFERENCE_PORTS:
            for client in [*outsiders, scraper]:
                assert not cluster.allowed(client, replica, port), f"{client.namespace}/{client.name} -> {port}"
            for front in data_plane:  # every region's proxies and Envoy pods: spill crosses regions
                assert cluster.allowed(front, replica, port), f"{front.name} -> {replica.name}:{port}"
            assert cluster.allowed(replica, replica, port)  # the agent, in the pod: Triton at the pod's own IP
        for port in METRICS_PORTS:
            assert cluster.allowed(scraper, replica, port), f"the scraper -> {replica.name}:{port}"
            for client in outsiders + data_plane:
                assert not cluster.allowed(client, replica, port), f"{client.namespace}/{client.name} -> {port}"
        other_replicas = [r for r in replicas if r != replica]
        assert all(not cluster.allowed(r, replica, p) for r in other_replicas for p in INFERENCE_PORTS)
    # the same question with the policies removed: everything reached everything (the check is not vacuous)
    open_cluster = Cluster([], {"ferry": {}, "default": {}})
    assert all(open_cluster.allowed(Pod("client", "default"), r, p) for r in replicas for p in INFERENCE_PORTS)
