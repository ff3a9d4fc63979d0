"""Which pod may open a connection to which pod's port, by the rendered NetworkPolicies (pure).

The semantics are those of the Kubernetes NetworkPolicy API,
``networking.k8s.io/v1`` (API reference: kubernetes.io/docs/reference/kubernetes-api/policy-resources/
network-policy-v1/; concepts: kubernetes.io/docs/concepts/services-networking/network-policies/):

- A policy applies to the pods of **its own namespace** that its ``spec.podSelector`` selects (an
  empty selector selects them all). ``policyTypes`` says which directions it governs; when absent,
  ``Ingress`` always, and ``Egress`` when the policy has ``egress`` rules.
- A pod selected by **no** policy governing a direction is not isolated in it: everything is allowed.
  A pod selected by at least one is **default-deny** in that direction, and a connection is allowed
  when it matches at least one rule of **any** of those policies (the union; policies never deny).
- A rule matches when its peers (``from`` / ``to``) and its ``ports`` both match; an absent or empty
  list matches everything. Peers are ORed. A peer with only ``podSelector`` selects pods of the
  **policy's** namespace; with only ``namespaceSelector``, every pod of the selected namespaces; with
  both, the pods the podSelector selects **within** the selected namespaces (AND). Every namespace
  carries the label ``kubernetes.io/metadata.name`` = its name.
- A port entry matches a ``protocol`` (default ``TCP``) and a ``port``: absent, every port; a number,
  that port (up to ``endPort`` when given, a range); a name, the target pod's container port of that
  name and protocol.
- A label selector is ``matchLabels`` AND every ``matchExpressions`` entry (``In``, ``NotIn``,
  ``Exists``, ``DoesNotExist``).
- A connection needs the source's egress and the target's ingress to allow it. A pod always reaches
  itself ("a pod cannot block access to itself"), and traffic from the pod's own node (the kubelet's
  probes) is always allowed: the latter is not a pod, so not modelled here.

``ipBlock`` peers select addresses, which this model does not know: a policy with one raises
:class:`ValueError` rather than be judged wrongly. Cost: O(policies x rules x peers) per question.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NAME_LABEL = "kubernetes.io/metadata.name"
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Port:
    """A container port: its number, name ("" for none) and protocol."""

    number: int
    name: str = ""
    protocol: str = "TCP"


@dataclass(frozen=True)
class Pod:
    """A pod as the policies see it: namespace, labels, container ports."""

    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects ``labels`` (an empty selector selects everything)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator not in OPERATORS:
            raise ValueError(f"matchExpressions.operator: {operator!r} is not one of {', '.join(OPERATORS)}")
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"matchExpressions.values: {operator} needs values (key {key!r})")
        present = key in labels
        matched = {"In": present and labels[key] in values, "NotIn": not present or labels[key] not in values,
                   "Exists": present, "DoesNotExist": not present}[operator]
        if not matched:
            return False
    return True


def policy_types(policy: Mapping[str, Any]) -> set[str]:
    """The directions a policy governs: ``policyTypes``, or its default (Ingress, and Egress with egress rules)."""
    spec = policy["spec"]
    if "policyTypes" in spec:
        return set(spec["policyTypes"])
    return {"Ingress", "Egress"} if spec.get("egress") else {"Ingress"}


class Cluster:
    """The rendered NetworkPolicies and the namespaces' labels; asks :meth:`allowed`."""

    def __init__(self, policies: Iterable[Mapping[str, Any]], namespaces: Mapping[str, Mapping[str, str]]) -> None:
        self.policies = [p for p in policies if p["kind"] == "NetworkPolicy"]
        for policy in self.policies:
            where = f"NetworkPolicy/{policy['metadata'].get('name')}"
            if not policy["metadata"].get("namespace"):
                raise ValueError(f"{where}: metadata.namespace is missing (render with a namespace)")
            rules = [*(policy["spec"].get("ingress") or []), *(policy["spec"].get("egress") or [])]
            for rule in rules:
                for peer in [*(rule.get("from") or []), *(rule.get("to") or [])]:
                    if "ipBlock" in peer:
                        raise ValueError(f"{where}: ipBlock peers select addresses, which this model does not know")
                    if not peer.keys() & {"podSelector", "namespaceSelector"}:
                        raise ValueError(f"{where}: a peer needs podSelector, namespaceSelector or ipBlock")
        self.namespaces = {name: {**labels, NAME_LABEL: name} for name, labels in namespaces.items()}

    def governing(self, pod: Pod, direction: str) -> list[Mapping[str, Any]]:
        """The policies of the pod's namespace that select it and govern ``direction`` (Ingress | Egress)."""
        return [p for p in self.policies if p["metadata"]["namespace"] == pod.namespace
                and direction in policy_types(p) and selects(p["spec"]["podSelector"], pod.labels)]

    def allowed(self, source: Pod, target: Pod, port: int, protocol: str = "TCP") -> bool:
        """Whether ``source`` may connect to ``target``'s ``port``: the source's egress and the target's ingress."""
        if source == target:
            return True  # a pod cannot block access to itself
        return (self._direction(source, "Egress", "egress", "to", source, target, port, protocol)
                and self._direction(target, "Ingress", "ingress", "from", source, target, port, protocol))

    def _direction(self, pod: Pod, direction: str, rules_key: str, peers_key: str, source: Pod, target: Pod,
                   port: int, protocol: str) -> bool:
        governing = self.governing(pod, direction)
        if not governing:
            return True  # not isolated in this direction
        other = target if direction == "Egress" else source
        return any(self._peers(rule.get(peers_key), policy["metadata"]["namespace"], other)
                   and ports_match(rule.get("ports"), target, port, protocol)
                   for policy in governing for rule in policy["spec"].get(rules_key) or [])

    def _peers(self, peers: Sequence[Mapping[str, Any]] | None, namespace: str, pod: Pod) -> bool:
        if not peers:
            return True
        return any(self._peer(peer, namespace, pod) for peer in peers)

    def _peer(self, peer: Mapping[str, Any], namespace: str, pod: Pod) -> bool:
        if "namespaceSelector" in peer:
            if pod.namespace not in self.namespaces:
                raise ValueError(f"namespace {pod.namespace!r} of pod {pod.name} is not declared")
            if not selects(peer["namespaceSelector"], self.namespaces[pod.namespace]):
                return False
        elif pod.namespace != namespace:
            return False  # a podSelector alone selects pods of the policy's own namespace
        return selects(peer.get("podSelector") or {}, pod.labels)


def ports_match(entries: Sequence[Mapping[str, Any]] | None, target: Pod, port: int, protocol: str) -> bool:
    """Whether a rule's ``ports`` admit ``port``/``protocol`` on ``target`` (absent or empty: every port)."""
    if not entries:
        return True
    for entry in entries:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, int):
            if wanted <= port <= entry.get("endPort", wanted):
                return True
        elif any(p.name == wanted and p.protocol == protocol and p.number == port for p in target.ports):
            return True
    return False


def pods_of(objects: Iterable[Mapping[str, Any]]) -> list[Pod]:
    """One pod per Deployment and StatefulSet of a render: its template's labels and every container port."""
    pods = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        template = obj["spec"]["template"]
        ports = tuple(Port(p["containerPort"], p.get("name", ""), p.get("protocol", "TCP"))
                      for c in template["spec"]["containers"] for p in c.get("ports", []))
        pods.append(Pod(obj["metadata"]["name"], obj["metadata"]["namespace"], template["metadata"]["labels"], ports))
    return pods
