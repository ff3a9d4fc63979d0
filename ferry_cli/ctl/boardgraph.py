"""The board's picture as a graph: a fleet snapshot (plain dataclasses) to Graphviz DOT source.

Pure: :func:`to_dot` reads a :class:`Snapshot` and returns a string; the I/O
(asking the Admin API, scraping metrics, running ``dot``) is
:mod:`ferry_cli.ctl.board`. Layout is Graphviz's ``dot`` (ranked, left to
right: services, proxies, tier queues, nodes, then the control side),
not placed by hand; the legend is the graph's label, under the picture.

What is drawn:

- one cluster per region with its services (the callers), its proxies (the
  Python relay), its Envoys and their endpoint pickers (the native path:
  services to Envoy, Envoy asking a picker over ``ext_proc``, Envoy to the
  replicas' nodes, untouched; Envoy's own rates are not measured, ``?``), its
  tier queues (``interactive``, ``standard``, ``batch``: waiting, rate,
  reserved and lent slots) and its nodes, each node one box listing its
  replicas coloured by state (at most :data:`MAX_REPLICAS_LISTED` a node,
  the rest counted by state; at most :data:`MAX_NODES_DRAWN` nodes a
  region, the rest folded into one box counted by state);
- the control side: every control plane (the leader marked ``LEADER``, bold),
  the store (etcd or the embedded one) and ferryctl;
- every data flow as a directed edge whose label names the wire and its
  live rate (:class:`Flow`): requests/s from services to proxies and from
  tier queues to nodes, tokens/s streamed back, telemetry/s from agents,
  table pushes/s to proxies, spill between regions, store revisions/s,
  follower reports and the Admin calls of ferryctl;
- a dead component (node not live, replica ``dead``, control plane
  unreachable, proxy disconnected, store unhealthy) is drawn dashed in red
  and says so in its label; edges to or from it are dashed;
- a legend mapping each requirement (:data:`REQUIREMENTS`, ``R1``…) to the
  components that serve it; each component's label lists the requirements
  it serves, so every requirement is visibly served by something drawn.

A rate that could not be measured (its metrics endpoint unknown) is drawn
``? /s`` rather than 0, so that an unmeasured flow is not read as idle.
"""

from __future__ import annotations

import dataclasses
import html
from collections import Counter
from collections.abc import Iterable, Sequence

MAX_REPLICAS_LISTED = 8   # replicas named in a node's box; the rest are counted by state
MAX_NODES_DRAWN = 16      # nodes drawn a region; the rest are folded into one box
TIERS = ("interactive", "standard", "batch")
STATE_COLOURS = {"ready": "#c8e6c9", "warming": "#fff59d", "draining": "#ffcc80", "drained": "#e0e0e0",
                 "dead": "#ef9a9a", "standby": "#bbdefb"}
DEAD_COLOUR = "#c62828"
KINDS = {  # a data-plane box: its title, what it does, the requirements it serves, its colour
    "proxy": ("proxy", "the Python relay", ["R1", "R4", "R7", "R8", "R10", "R12", "R13"], "#e8f5e9"),
    "picker": ("picker", "decides for Envoy (ext_proc)", ["R1", "R2", "R4", "R7", "R8", "R10"], "#e0f2f1"),
    "envoy": ("Envoy", "forwards; tokens cross no Python", ["R1", "R4"], "#e3f2fd"),
}


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One requirement of the product briefs and the components of the board that serve it."""

    key: str          # R1, R2, ...
    text: str         # the requirement, in the project's words
    served_by: str    # the component(s), as docs/design.md names them


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("R1", "route each request to a replica with capacity and its prompt's cached prefix",
                "proxy: the pick (dataplane/pick: prefix keys, bounded-load ring, p2c on pushed load)"),
    Requirement("R2", "tiers interactive > standard > batch share the fleet; interactive latency protected",
                "tier queues (dataplane/admission: reserved shares, lending, reclaim, preemption); "
                "tier quotas in each table"),
    Requirement("R3", "regions, with spill to a region that has room within the latency budget",
                "leader: spill weights (controlplane/regions); tier queues: the region step; spill edges"),
    Requirement("R4", "failover when a node dies", "agents' telemetry and member leases (node -> control plane); "
                "proxy: retries, stream continuation, outlier ejection (dataplane/failover)"),
    Requirement("R5", "tables reach every proxy within a second",
                "leader: table computed on change and each tick, pushed on Tables.Watch (controlplane/tables)"),
    Requirement("R6", "control-plane failover and static stability",
                "store (etcd leases, one intent writer); control planes: one leader, followers relay "
                "(controlplane/cluster); proxies keep the last table"),
    Requirement("R7", "tenants, plans and quotas",
                "proxy: API keys, tenant limits at admission (dataplane/admission); tenants kept in the store"),
    Requirement("R8", "rollouts and canaries",
                "leader: version weights in the table (controlplane/rollout); proxy: the canary draw"),
    Requirement("R9", "batch traffic and the fixed-batch runtime",
                "tier queues: the batch tier; nodes: the batch runtime (agent/batch)"),
    Requirement("R10", "GPU placement: whole-node gangs for large models, cold starts",
                "leader: gang allocation (controlplane/allocation); nodes: GPUs; proxy: cold-start wait"),
    Requirement("R11", "observability", "ferryctl over the Admin API (status, top, this board); metrics; logs"),
    Requirement("R12", "guardrails on the prompt and the answer, inside the latency budget",
                "proxy: guardrail hooks (dataplane/guard) before the queue and on each window of the answer"),
    Requirement("R13", "a response cache only where the measured duplicate rate earns it",
                "proxy: duplicate-rate sketch and per-tenant cache (dataplane/cache); leader: merged rates"),
    Requirement("R14", "scale down at night without hurting the morning ramp; a warm pool of hardware",
                "leader: the scaling plan (controlplane/scaling: needed now and for the ramp, standby nodes)"),
)


@dataclasses.dataclass(frozen=True)
class ControlPlane:
    """A control plane as the board shows it."""

    id: str
    address: str
    leader: bool
    reachable: bool
    role: str = ""
    agents: int = 0
    telemetry_per_s: float | None = None   # agent telemetry messages it received per second


@dataclasses.dataclass(frozen=True)
class Store:
    """The store the control planes share."""

    backend: str          # etcd | memory
    endpoint: str
    healthy: bool
    revisions_per_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Proxy:
    """A table consumer of the data plane: a proxy (the Python relay), an endpoint picker or an Envoy
    (``kind``, :func:`kind_of`); the control plane it watches from, its rates."""

    id: str
    region: str
    control_plane: str
    connected: bool
    lag_versions: int = 0
    requests_per_s: float | None = None    # requests it answered (a picker: decided) per second
    tokens_per_s: float | None = None      # tokens it streamed back per second
    pushes_per_s: float | None = None      # table snapshots it was sent per second
    kind: str = "proxy"                    # proxy | picker | envoy


def kind_of(proxy_id: str) -> str:
    """``envoy`` or ``picker`` by the id ``ferry up`` and the manifests give them (``envoy``, ``picker-1``,
    ``POD-envoy``, ``POD-picker-1``), else ``proxy``."""
    if proxy_id == "envoy" or proxy_id.endswith("-envoy"):
        return "envoy"
    if proxy_id.startswith("picker-") or "-picker-" in proxy_id:
        return "picker"
    return "proxy"


@dataclasses.dataclass(frozen=True)
class TierQueue:
    """One tier's queue in a region's proxies."""

    region: str
    tier: str
    queued: int
    rate_per_s: float
    reserved: int = 0
    lent: int = 0


@dataclasses.dataclass(frozen=True)
class Replica:
    """A replica on a node."""

    id: str
    model: str
    version: str
    state: str


@dataclasses.dataclass(frozen=True)
class Node:
    """A node, its agent's stream and its replicas."""

    name: str
    region: str
    gpus: int
    live: bool
    agent_connected: bool
    control_plane: str
    cordoned: bool = False
    replicas: tuple[Replica, ...] = ()
    requests_per_s: float | None = None     # requests its replicas completed per second
    telemetry_per_s: float | None = None    # its agent's telemetry messages per second


@dataclasses.dataclass(frozen=True)
class Spill:
    """Interactive work one region's proxies send to another's replicas."""

    source: str
    target: str
    weight: float
    rate_per_s: float


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The fleet at one moment, with the rates measured over the interval before it."""

    control_planes: tuple[ControlPlane, ...]
    store: Store
    proxies: tuple[Proxy, ...]
    nodes: tuple[Node, ...]
    tiers: tuple[TierQueue, ...] = ()
    spills: tuple[Spill, ...] = ()
    admin_calls_per_s: float | None = None  # this board's own Admin calls
    title: str = "Ferry"

    def regions(self) -> list[str]:
        """Every region named by a proxy, node or tier queue, sorted."""
        return sorted({p.region for p in self.proxies} | {n.region for n in self.nodes}
                      | {t.region for t in self.tiers})

    def leader(self) -> ControlPlane | None:
        """The leading control plane, when one is known."""
        return next((c for c in self.control_planes if c.leader), None)


@dataclasses.dataclass(frozen=True)
class Flow:
    """A directed edge: from, to, the wire's name, the rate text, and whether an end is dead."""

    source: str
    target: str
    wire: str
    rate: str
    dead: bool = False
    requirements: str = ""
    constraint: bool = True   # False: the edge does not pull its ends into ranks (a flow back up the picture)


def rate(value: float | None, unit: str) -> str:
    """``12.3 req/s``; ``? req/s`` when unmeasured (None); one decimal under 100, whole above."""
    if value is None:
        return f"? {unit}/s"
    return f"{value:.1f} {unit}/s" if abs(value) < 100 else f"{value:,.0f} {unit}/s"


def node_id(kind: str, name: str) -> str:
    """A DOT identifier for a component (quoted, so any name is safe)."""
    return '"' + f"{kind}:{name}".replace("\\", "\\\\").replace('"', '\\"') + '"'


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _tags(keys: Iterable[str]) -> str:
    return f'<FONT POINT-SIZE="9" COLOR="#1565c0">serves {_e(" ".join(keys))}</FONT>'


def _box(rows: Sequence[str], *, colour: str = "#ffffff", border: int = 1) -> str:
    """An HTML-like label: one cell a row."""
    cells = "".join(f"<TR><TD>{r}</TD></TR>" for r in rows)
    return f'<<TABLE BORDER="{border}" CELLBORDER="0" CELLSPACING="0" BGCOLOR="{colour}">{cells}</TABLE>>'


def _dead_style(dead: bool) -> str:
    return (f', shape=box, style="dashed,rounded", penwidth=2, color="{DEAD_COLOUR}", fontcolor="{DEAD_COLOUR}"'
            if dead else "")


def _node(ident: str, label: str, *, dead: bool = False, extra: str = "") -> str:
    return f"  {ident} [label={label}{_dead_style(dead)}{extra}];"


def _edge(flow: Flow) -> str:
    label = f"{flow.wire}\\n{flow.rate}" + (f" [{flow.requirements}]" if flow.requirements else "")
    style = f', style=dashed, color="{DEAD_COLOUR}"' if flow.dead else ""
    if not flow.constraint:
        style += ", constraint=false"
    label = label.replace('"', '\\"')
    return f'  {flow.source} -> {flow.target} [label="{label}", dir=forward{style}];'


def _replica_rows(replicas: Sequence[Replica]) -> list[str]:
    rows = []
    for r in replicas[:MAX_REPLICAS_LISTED]:
        colour = STATE_COLOURS.get(r.state, "#ffffff")
        rows.append(f'<TABLE BORDER="0" CELLSPACING="0"><TR><TD BGCOLOR="{colour}" ALIGN="LEFT">'
                    f"{_e(r.id)} {_e(r.model)}:{_e(r.version)} <B>{_e(r.state)}</B></TD></TR></TABLE>")
    rest = Counter(r.state for r in replicas[MAX_REPLICAS_LISTED:])
    if rest:
        rows.append(_e("+ " + ", ".join(f"{n} {s}" for s, n in sorted(rest.items()))))
    return rows


def _node_label(n: Node) -> str:
    status = "DEAD" if not n.live else ("agent away" if not n.agent_connected else "agent connected")
    if n.cordoned:
        status += ", CORDONED"
    head = f"<B>node {_e(n.name)}</B> ({n.gpus} GPUs) - {_e(status)}"
    return _box([head, *_replica_rows(n.replicas), _tags(["R4", "R9", "R10"])],
                colour="#fafafa" if n.live else "#ffebee")


def _folded_label(region: str, nodes: Sequence[Node]) -> str:
    states = Counter(r.state for n in nodes for r in n.replicas)
    dead = sum(1 for n in nodes if not n.live)
    text = ", ".join(f"{c} {s}" for s, c in sorted(states.items())) or "no replicas"
    return _box([f"<B>{len(nodes)} more nodes of {_e(region)}</B> ({dead} dead)", _e(text),
                 _tags(["R4", "R9", "R10"])])


def _sum(values: Iterable[float | None]) -> float | None:
    """The sum of ``values``; None (unmeasured) when any is."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def flows(s: Snapshot) -> list[Flow]:
    """Every directed flow of the snapshot (the edges :func:`to_dot` draws), in drawing order."""
    out: list[Flow] = []
    planes = {c.id: c for c in s.control_planes}
    leader = s.leader()
    regions = s.regions()
    for p in s.proxies:
        gone = not p.connected
        source = planes.get(p.control_plane)
        if source is not None:
            what = "endpoint list" if p.kind == "envoy" else "table pushes"
            out.append(Flow(node_id("cp", source.id), node_id("proxy", p.id), f"Tables.Watch: {what}",
                            rate(p.pushes_per_s, "push"), gone or not source.reachable, "R5", constraint=False))
        if p.kind == "envoy":  # the native path: Envoy carries the bytes, its pickers decide
            pickers = [q for q in s.proxies if q.kind == "picker" and q.region == p.region]
            decided = _sum(q.requests_per_s for q in pickers)
            out.append(Flow(node_id("services", p.region), node_id("proxy", p.id), "OpenAI HTTP, KServe v2 gRPC",
                            rate(decided, "req"), gone, "R1 R7"))
            out.append(Flow(node_id("proxy", p.id), node_id("services", p.region), "answers streamed back, native",
                            rate(None, "tok"), gone))
            for q in pickers:
                out.append(Flow(node_id("proxy", p.id), node_id("proxy", q.id), "ext_proc: where to?",
                                rate(q.requests_per_s, "req"), gone or not q.connected, "R1"))
            members = [n for n in s.nodes if n.region == p.region][:MAX_NODES_DRAWN]
            for n in members:
                out.append(Flow(node_id("proxy", p.id), node_id("node", n.name), "same bytes, untouched",
                                rate(None, "req"), gone or not n.live, "R1", constraint=False))
            continue
        if p.kind == "proxy":
            out.append(Flow(node_id("services", p.region), node_id("proxy", p.id), "requests (gRPC, HTTP)",
                            rate(p.requests_per_s, "req"), gone, "R1 R7"))
            out.append(Flow(node_id("proxy", p.id), node_id("services", p.region), "tokens streamed back",
                            rate(p.tokens_per_s, "tok"), gone))
        out.append(Flow(node_id("proxy", p.id), node_id("tiers", p.region), "admit", rate(p.requests_per_s, "req"),
                        gone, "R2"))
    for region in regions:
        members = [n for n in s.nodes if n.region == region]
        drawn, folded = members[:MAX_NODES_DRAWN], members[MAX_NODES_DRAWN:]
        for n in drawn:
            out.append(Flow(node_id("tiers", region), node_id("node", n.name), "KServe v2 gRPC",
                            rate(n.requests_per_s, "req"), not n.live, "R1"))
            holder = planes.get(n.control_plane) or leader
            if holder is not None:
                out.append(Flow(node_id("node", n.name), node_id("cp", holder.id), "Fleet.Connect: telemetry",
                                rate(n.telemetry_per_s, "msg"), not n.live or not holder.reachable, "R4"))
        if folded and leader is not None:
            out.append(Flow(node_id("tiers", region), node_id("folded", region), "KServe v2 gRPC",
                            rate(_sum(n.requests_per_s for n in folded), "req"), False, "R1"))
            out.append(Flow(node_id("folded", region), node_id("cp", leader.id), "Fleet.Connect: telemetry",
                            rate(_sum(n.telemetry_per_s for n in folded), "msg"), False, "R4"))
    for sp in s.spills:
        out.append(Flow(node_id("tiers", sp.source), node_id("tiers", sp.target), f"spill (weight {sp.weight:.2f})",
                        rate(sp.rate_per_s, "req"), False, "R3"))
    for c in s.control_planes:
        out.append(Flow(node_id("cp", c.id), node_id("store", "store"), "leases, intent, watches",
                        rate(s.store.revisions_per_s, "rev"), not c.reachable or not s.store.healthy, "R6"))
        if leader is not None and c.id != leader.id:
            out.append(Flow(node_id("cp", c.id), node_id("cp", leader.id), "Admin.Follow: relays its agents",
                            rate(c.telemetry_per_s, "msg"), not c.reachable or not leader.reachable, "R6"))
    target = leader or (s.control_planes[0] if s.control_planes else None)
    if target is not None:
        out.append(Flow(node_id("ferryctl", "board"), node_id("cp", target.id), "Admin API",
                        rate(s.admin_calls_per_s, "call"), not target.reachable, "R11"))
    return out


def _legend(title: str) -> str:
    """The graph's label, under the picture: the title, then every requirement and what serves it."""
    rows = [f'<TR><TD COLSPAN="3" BGCOLOR="#e3f2fd"><FONT POINT-SIZE="14"><B>{_e(title)}</B></FONT></TD></TR>',
            '<TR><TD COLSPAN="3"><B>every requirement of the briefs and the component that serves it</B></TD></TR>']
    for r in REQUIREMENTS:
        rows.append(f'<TR><TD ALIGN="LEFT"><B>{_e(r.key)}</B></TD><TD ALIGN="LEFT">{_e(r.text)}</TD>'
                    f'<TD ALIGN="LEFT">{_e(r.served_by)}</TD></TR>')
    states = "".join(f'<TD BGCOLOR="{c}">{_e(s)}</TD>' for s, c in STATE_COLOURS.items())
    rows.append(f'<TR><TD ALIGN="LEFT"><B>replicas</B></TD><TD COLSPAN="2"><TABLE BORDER="0"><TR>{states}'
                f"</TR></TABLE></TD></TR>")
    rows.append('<TR><TD ALIGN="LEFT"><B>edges</B></TD><TD COLSPAN="2" ALIGN="LEFT">arrow: the direction data '
                "flows; label: the wire, its rate over the last interval, [the requirements it serves]; "
                "dashed red: an end is dead; ? /s: not measured</TD></TR>")
    return f'<<TABLE BORDER="1" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">{"".join(rows)}</TABLE>>'


def to_dot(s: Snapshot) -> str:
    """The DOT source of the board for snapshot ``s`` (see the module docstring for what is drawn).

    Ranks follow the request path (services, proxies, tier queues, nodes, then the control side their
    telemetry reaches); table pushes flow back against it and do not pull ranks (``constraint=false``)."""
    lines = [
        "digraph ferry {",
        f'  graph [rankdir=LR, fontname="Helvetica", fontsize=11, labelloc=b, labeljust=l, label={_legend(s.title)}, '
        'newrank=true, nodesep=0.35, ranksep=1.1];',
        '  node [shape=plain, fontname="Helvetica", fontsize=11, margin="0.08,0.04"];',
        '  edge [fontname="Helvetica", fontsize=10, color="#37474f", fontcolor="#263238"];',
    ]
    lines.append('  subgraph cluster_control {\n  label="control side"; style="rounded"; color="#90a4ae";')
    for c in s.control_planes:
        role = "LEADER" if c.leader else (c.role or "follower")
        state = "" if c.reachable else " - UNREACHABLE"
        rows = [f"<B>control plane {_e(c.id)}</B>", _e(f"{role}{state}"), _e(f"{c.address}, {c.agents} agents"),
                _tags(["R3", "R5", "R6", "R8", "R10", "R14"] if c.leader else ["R6"])]
        lines.append(_node(node_id("cp", c.id), _box(rows, colour="#fff8e1" if c.leader else "#ffffff",
                                                     border=3 if c.leader else 1),
                           dead=not c.reachable))
    st = s.store
    rows = [f"<B>store: {_e(st.backend)}</B>", _e(st.endpoint or "embedded in the control plane"),
            _e("healthy" if st.healthy else "UNHEALTHY"), _tags(["R4", "R6", "R7"])]
    lines.append(_node(node_id("store", "store"), _box(rows, border=0), dead=not st.healthy,
                       extra=", shape=cylinder, margin=0.15"))
    lines.append(_node(node_id("ferryctl", "board"), _box(["<B>ferryctl</B>", "operator, Admin token",
                                                           _tags(["R11"])])))
    lines.append("  }")
    for region in s.regions():
        ident = "cluster_region_" + "".join(ch if ch.isalnum() else "_" for ch in region)
        lines.append(f'  subgraph {ident} {{\n  label="region {_dot(region)}"; style="rounded"; color="#78909c";')
        callers = _box([f"<B>services</B> ({_e(region)})", "callers with API keys"], border=0)
        lines.append(_node(node_id("services", region), callers, extra=", shape=oval, margin=0.05"))
        for p in (p for p in s.proxies if p.region == region):
            state = "connected" if p.connected else "DISCONNECTED"
            title, what, tags, colour = KINDS[p.kind]
            rows = [f"<B>{_e(title)} {_e(p.id)}</B>", _e(what), _e(f"{state}, table lag {p.lag_versions}"),
                    _tags(tags)]
            lines.append(_node(node_id("proxy", p.id), _box(rows, colour=colour if p.connected else "#ffebee"),
                               dead=not p.connected))
        queue_rows = [f"<B>tier queues</B> ({_e(region)}, in every proxy)",
                      '<FONT POINT-SIZE="9">waiting; requests/s (the last second); slots reserved, lent</FONT>']
        for t in sorted((t for t in s.tiers if t.region == region), key=lambda t: TIERS.index(t.tier)
                        if t.tier in TIERS else len(TIERS)):
            queue_rows.append(_e(f"{t.tier}: {t.queued} waiting, {rate(t.rate_per_s, 'req')}, "
                                 f"{t.reserved} reserved, {t.lent} lent"))
        queue_rows.append(_tags(["R2", "R3", "R9", "R10"]))
        lines.append(_node(node_id("tiers", region), _box(queue_rows, colour="#f3e5f5")))
        members = [n for n in s.nodes if n.region == region]
        for n in members[:MAX_NODES_DRAWN]:
            lines.append(_node(node_id("node", n.name), _node_label(n), dead=not n.live))
        if members[MAX_NODES_DRAWN:]:
            lines.append(_node(node_id("folded", region), _folded_label(region, members[MAX_NODES_DRAWN:])))
        lines.append("  }")
    lines.extend(_edge(f) for f in flows(s))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
