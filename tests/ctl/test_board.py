"""``ferryctl board``'s pure parts: the DOT builder, the rates from two samples, the metric pages; its refusals.

The picture is checked on its DOT source: every component is a labelled
node, every edge is directed and its label carries a rate, the leader is
marked, dead components say so and are drawn dashed in red, every
requirement of the legend is served by a drawn component, and big fleets
are folded. One test renders the source with the real ``dot`` (Debian's
graphviz, installed by ``make graphviz``).
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ferry.v1 import admin_pb2
from ferry_cli.ctl import board
from ferry_cli.ctl import boardgraph as g
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.main import build_parser

ID = r'"(?:[^"\\]|\\.)*"'
EDGE = re.compile(rf'^  ({ID}) -> ({ID}) \[label="(.*?)", dir=forward(.*)\];$')
NODE = re.compile(rf'^  ({ID}) \[label=(.*)\];$')


def fleet(**changes: Any) -> g.Snapshot:
    snap = g.Snapshot(
        control_planes=(g.ControlPlane("cp-1", "127.0.0.1:1", True, True, "leader", 2, 4.0),
                        g.ControlPlane("cp-2", "127.0.0.1:2", False, True, "follower", 1, 2.0)),
        store=g.Store("etcd", "127.0.0.1:2379", True, 3.5),
        proxies=(g.Proxy("proxy-a", "east", "cp-1", True, 0, 12.5, 340.0, 2.0),
                 g.Proxy("proxy-b", "west", "cp-2", True, 0, 1.0, 30.0, 2.0)),
        nodes=(g.Node("n1", "east", 8, True, True, "cp-1", False,
                      (g.Replica("n1-r0", "chat", "v1", "ready"), g.Replica("n1-r1", "chat", "v2", "warming")),
                      6.0, 2.0),
               g.Node("n2", "east", 8, True, True, "cp-1", False, (g.Replica("n2-r0", "chat", "v1", "ready"),),
                      6.5, 2.0),
               g.Node("n3", "west", 8, True, True, "cp-2", False, (g.Replica("n3-r0", "chat", "v1", "ready"),),
                      1.0, 2.0)),
        tiers=tuple(g.TierQueue(r, t, 1, 2.0, 10, 0) for r in ("east", "west") for t in g.TIERS),
        spills=(g.Spill("east", "west", 0.25, 1.5),),
        admin_calls_per_s=1.5, title="test fleet")
    return replace(snap, **changes)


def edges(dot: str) -> list[tuple[str, str, str, str]]:
    found = [m.groups() for line in dot.splitlines() if (m := EDGE.match(line))]
    assert len(found) == dot.count(" -> "), "every edge line is one directed, labelled edge"
    return found


def nodes(dot: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in dot.splitlines() if (m := NODE.match(line))}


def test_every_component_is_a_labelled_node() -> None:
    snap = fleet()
    drawn = nodes(g.to_dot(snap))
    expected = ({g.node_id("cp", c.id) for c in snap.control_planes} | {g.node_id("proxy", p.id) for p in snap.proxies}
                | {g.node_id("node", n.name) for n in snap.nodes} | {g.node_id("tiers", r) for r in snap.regions()}
                | {g.node_id("services", r) for r in snap.regions()}
                | {g.node_id("store", "store"), g.node_id("ferryctl", "board")})
    assert expected <= set(drawn)
    for ident, label in drawn.items():
        assert label.startswith("<<TABLE") and "<B>" in label, ident
    assert "control plane cp-1" in drawn[g.node_id("cp", "cp-1")]
    assert "proxy proxy-a" in drawn[g.node_id("proxy", "proxy-a")]
    assert "store: etcd" in drawn[g.node_id("store", "store")]
    node = drawn[g.node_id("node", "n1")]
    assert "n1-r0 chat:v1 <B>ready</B>" in node and "n1-r1 chat:v2 <B>warming</B>" in node
    assert g.STATE_COLOURS["warming"] in node
    tiers = drawn[g.node_id("tiers", "east")]
    for tier in g.TIERS:
        assert f"{tier}: 1 waiting, 2.0 req/s, 10 reserved, 0 lent" in tiers


def test_every_edge_is_directed_and_labelled_with_a_rate() -> None:
    dot = g.to_dot(fleet())
    found = edges(dot)
    assert len(found) == len(g.flows(fleet()))
    for source, target, label, _ in found:
        assert source != target
        assert re.search(r"[0-9?][0-9.,]* (req|tok|msg|push|rev|call)/s", label), label
    labels = {label.split("\\n")[0] for _, _, label, _ in found}
    assert {"requests (gRPC, HTTP)", "tokens streamed back", "admit", "KServe v2 gRPC", "Fleet.Connect: telemetry",
            "Tables.Watch: table pushes", "leases, intent, watches", "Admin.Follow: relays its agents", "Admin API",
            "spill (weight 0.25)"} == labels
    pairs = {(s, t) for s, t, _, _ in found}
    assert (g.node_id("services", "east"), g.node_id("proxy", "proxy-a")) in pairs  # requests go in
    assert (g.node_id("proxy", "proxy-a"), g.node_id("services", "east")) in pairs  # tokens come back
    assert (g.node_id("node", "n1"), g.node_id("cp", "cp-1")) in pairs              # telemetry goes up
    assert (g.node_id("cp", "cp-2"), g.node_id("proxy", "proxy-b")) in pairs        # tables from its control plane
    assert (g.node_id("cp", "cp-2"), g.node_id("cp", "cp-1")) in pairs              # the follower reports
    assert (g.node_id("tiers", "east"), g.node_id("tiers", "west")) in pairs        # spill
    assert any("12.5 req/s" in label for s, _, label, _ in found if s == g.node_id("services", "east"))
    assert any("340 tok/s" in label for _, t, label, _ in found if t == g.node_id("services", "east"))


def test_only_the_leader_is_marked() -> None:
    drawn = nodes(g.to_dot(fleet()))
    assert "LEADER" in drawn[g.node_id("cp", "cp-1")] and 'BORDER="3"' in drawn[g.node_id("cp", "cp-1")]
    assert "LEADER" not in drawn[g.node_id("cp", "cp-2")] and "follower" in drawn[g.node_id("cp", "cp-2")]
    no_leader = fleet(control_planes=tuple(replace(c, leader=False) for c in fleet().control_planes))
    assert "LEADER" not in g.to_dot(no_leader)


def test_dead_components_are_shown_dead_and_their_flows_dashed() -> None:
    base = fleet()
    snap = replace(base,
                   control_planes=(base.control_planes[0], replace(base.control_planes[1], reachable=False)),
                   store=replace(base.store, healthy=False),
                   proxies=(base.proxies[0], replace(base.proxies[1], connected=False)),
                   nodes=(replace(base.nodes[0], live=False, agent_connected=False,
                                  replicas=(g.Replica("n1-r0", "chat", "v1", "dead"),)), *base.nodes[1:]))
    dot = g.to_dot(snap)
    lines = dot.splitlines()

    def line_of(ident: str) -> str:
        return next(line for line in lines if line.startswith(f"  {ident} [label="))

    for ident, word in ((g.node_id("cp", "cp-2"), "UNREACHABLE"), (g.node_id("store", "store"), "UNHEALTHY"),
                        (g.node_id("proxy", "proxy-b"), "DISCONNECTED"), (g.node_id("node", "n1"), "DEAD")):
        assert word in line_of(ident) and "dashed" in line_of(ident) and g.DEAD_COLOUR in line_of(ident), ident
    assert g.STATE_COLOURS["dead"] in line_of(g.node_id("node", "n1"))
    for ident in (g.node_id("node", "n2"), g.node_id("proxy", "proxy-a")):
        assert "dashed" not in line_of(ident)
    dead_ends = {g.node_id("node", "n1"), g.node_id("proxy", "proxy-b"), g.node_id("cp", "cp-2"),
                 g.node_id("store", "store")}
    for source, target, label, style in edges(dot):
        assert ("dashed" in style) == bool({source, target} & dead_ends), (source, target, label)


def test_an_unmeasured_rate_is_a_question_mark_not_zero() -> None:
    snap = fleet(proxies=(replace(fleet().proxies[0], tokens_per_s=None),))
    labels = [label for _, t, label, _ in edges(g.to_dot(snap)) if t == g.node_id("services", "east")]
    assert labels == ["tokens streamed back\\n? tok/s"]
    assert g.rate(None, "req") == "? req/s" and g.rate(0.0, "req") == "0.0 req/s" and g.rate(1234, "tok") == \
        "1,234 tok/s"


def test_every_requirement_is_in_the_legend_and_served_by_a_drawn_component() -> None:
    dot = g.to_dot(fleet())
    legend = dot.split("label=<<TABLE", 1)[1].split("</TABLE>>", 1)[0]
    served = set(re.findall(r"serves ([R0-9 ]+)</FONT>", dot))
    keys = {k for tags in served for k in tags.split()}
    for r in g.REQUIREMENTS:
        assert f"<B>{r.key}</B>" in legend and r.text.replace("'", "&#x27;").replace(">", "&gt;") in legend
        assert r.key in keys, f"{r.key} is served by no component on the board"


def test_a_big_fleet_is_folded_and_names_are_escaped() -> None:
    many = tuple(g.Replica(f"r{i}", "chat", "v1", "dead" if i % 2 else "ready") for i in range(20))
    nodes_ = tuple(g.Node(f'n"{i}<', "east", 8, True, True, "cp-1", False, many if i == 0 else (), 1.0, 2.0)
                   for i in range(g.MAX_NODES_DRAWN + 5))
    dot = g.to_dot(fleet(nodes=nodes_, title='a "quoted" <title>'))
    drawn = nodes(dot)
    assert sum(1 for k in drawn if k.startswith('"node:')) == g.MAX_NODES_DRAWN
    assert "5 more nodes of east" in drawn[g.node_id("folded", "east")]
    first = drawn[g.node_id("node", 'n"0<')]
    assert first.count("chat:v1") == g.MAX_REPLICAS_LISTED and "+ 6 dead, 6 ready" in first
    assert "n&quot;0&lt;" in first and "&lt;title&gt;" in dot
    assert any(t == g.node_id("folded", "east") for _, t, _, _ in edges(dot))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (make graphviz)")
def test_dot_renders_the_source(tmp_path: Path) -> None:
    files = board.render(g.to_dot(fleet()), tmp_path)
    assert [f.name for f in files] == ["board.dot", "board.svg", "board.png"]
    svg = html.unescape((tmp_path / "board.svg").read_text())
    assert "proxy proxy-a" in svg and "LEADER" in svg and "12.5 req/s" in svg
    assert (tmp_path / "board.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))
    check = subprocess.run(["dot", "-Tcanon", str(tmp_path / "board.dot")], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0 and not check.stderr, check.stderr


def test_render_without_dot_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="graphviz"):
        board.render("digraph {}", tmp_path)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (make graphviz)")
def test_an_out_directory_that_cannot_be_written_is_refused_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(UsageError, match="--out"):
        board.render("digraph {}", blocker / "board")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (make graphviz)")
def test_a_source_dot_refuses_is_reported_and_leaves_no_picture(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="could not render"):
        board.render("digraph { a -> }", tmp_path)
    assert not (tmp_path / "board.svg").exists() and not (tmp_path / "board.png").exists()
    assert not list(tmp_path.glob(".*.tmp"))


# ---- rates from two samples -------------------------------------------------------------------------------

def status(revision: int, *, proxy_connected: bool = True) -> dict[str, Any]:
    return {
        "leader": {"id": "cp-1", "address": "127.0.0.1:1", "term": 1},
        "store": {"backend": "etcd", "endpoint": "127.0.0.1:2379", "healthy": True, "revision": revision},
        "control_planes": [{"id": "cp-1", "address": "127.0.0.1:1", "leader": True, "role": "leader",
                            "reachable": True, "agents": 2}],
        "proxies": [{"proxy_id": "proxy-1", "region": "local", "control_plane": "cp-1", "lag_versions": 0,
                     "connected": proxy_connected}],
    }


def node(name: str, replicas: list[str], *, live: bool = True) -> dict[str, Any]:
    return {"node": name, "region": "local", "gpus": 8, "live": live, "agent_connected": live,
            "control_plane": "cp-1", "cordoned": False, "replica_ids": replicas}


def sample(at: float, served: dict[str, int], counters: dict[tuple[str, ...], float], *, revision: int = 10,
           calls: int = 7, live: bool = True, proxy_connected: bool = True) -> board.Sample:
    replicas = [{"id": r, "model": "chat", "version": "v1", "state": "ready"} for r in served]
    return board.Sample(at=at, status=status(revision, proxy_connected=proxy_connected),
                        nodes=[node("n1", ["n1-r0"]), node("n2", ["n2-r0"], live=live)], replicas=replicas,
                        served=served, tiers=[], spills=[], usage=admin_pb2.GetUsageResponse(sampled_at=at),
                        counters=counters, admin_calls=calls)


def test_rates_come_from_the_change_of_each_counter_over_the_window() -> None:
    before = sample(100.0, {"n1-r0": 10, "n2-r0": 50},
                    {(board.PROXY_REQUESTS, "proxy-1"): 100, (board.PROXY_TOKENS, "proxy-1"): 1000,
                     (board.TELEMETRY, "cp-1"): 40, (board.PUSHES, "cp-1", "local"): 5})
    after = sample(102.0, {"n1-r0": 30, "n2-r0": 20},  # n2-r0 restarted: its counter went back
                   {(board.PROXY_REQUESTS, "proxy-1"): 120, (board.PROXY_TOKENS, "proxy-1"): 1600,
                    (board.TELEMETRY, "cp-1"): 48, (board.PUSHES, "cp-1", "local"): 9}, revision=16, calls=21)
    snap = board.snapshot(before, after, "t")
    proxy = snap.proxies[0]
    assert (proxy.requests_per_s, proxy.tokens_per_s, proxy.pushes_per_s) == (10.0, 300.0, 2.0)
    assert snap.control_planes[0].telemetry_per_s == 4.0 and snap.control_planes[0].leader
    assert {n.name: (n.requests_per_s, n.telemetry_per_s) for n in snap.nodes} == {"n1": (10.0, 2.0),
                                                                                   "n2": (0.0, 2.0)}
    assert snap.store.revisions_per_s == 3.0 and snap.admin_calls_per_s == 7.0


def test_unknown_metrics_leave_rates_unmeasured_and_dead_parts_carry_nothing() -> None:
    before = sample(0.0, {"n1-r0": 1, "n2-r0": 1}, {})
    after = sample(1.0, {"n1-r0": 3}, {}, live=False, proxy_connected=False)
    snap = board.snapshot(before, after)
    assert snap.control_planes[0].telemetry_per_s is None
    dead = next(n for n in snap.nodes if n.name == "n2")
    assert not dead.live and (dead.requests_per_s, dead.telemetry_per_s) == (0.0, 0.0)
    live = next(n for n in snap.nodes if n.name == "n1")
    assert live.requests_per_s == 2.0 and live.telemetry_per_s is None
    assert not snap.proxies[0].connected and snap.proxies[0].requests_per_s == 0.0
    assert board.per_second(None, 3.0, 1.0) is None and board.per_second(1.0, 3.0, 0.0) is None


def test_metric_pages_are_matched_to_component_ids() -> None:
    proxy_page = ('ferry_proxy_requests_total{model="chat",tier="interactive",status="OK"} 7\n'
                  'ferry_proxy_requests_total{model="chat",tier="batch",status="OK"} 3\n'
                  'ferry_proxy_generation_tokens_total{model="chat",tier="batch"} 90\n')
    plane_page = ('ferry_controlplane_telemetry_messages_total 12\n'
                  'ferry_controlplane_table_pushes_total{region="local"} 4\n'
                  'ferry_controlplane_table_pushes_total{region="west"} 2\n')
    found = board.counters({"proxy": proxy_page, "controlplane-1": plane_page, "node-1": "agent_x 1\n",
                            "stranger": proxy_page}, {"proxy-1"}, {"controlplane-1"})
    assert found == {(board.PROXY_REQUESTS, "proxy-1"): 10.0, (board.PROXY_TOKENS, "proxy-1"): 90.0,
                     (board.TELEMETRY, "controlplane-1"): 12.0, (board.PUSHES, "controlplane-1", "local"): 4.0,
                     (board.PUSHES, "controlplane-1", "west"): 2.0}


def test_endpoints_come_from_the_ready_file(tmp_path: Path) -> None:
    ready = tmp_path / "up.json"
    ready.write_text('{"metrics": {"proxy": "127.0.0.1:9", "node-1": null}}')
    assert board.endpoints(argparse.Namespace(ready_file=str(ready))) == {"proxy": "127.0.0.1:9"}
    assert board.endpoints(argparse.Namespace(ready_file=None)) == {}


def test_a_metrics_endpoint_that_does_not_answer_is_skipped() -> None:
    assert board.scrape("127.0.0.1:1") is None


@pytest.mark.parametrize(("flags", "field"), [(["--window", "0"], "--window"), (["--interval", "-1"], "--interval"),
                                              (["--count", "-2"], "--count")])
def test_bad_flags_are_refused_naming_the_flag(flags: list[str], field: str) -> None:
    args = build_parser().parse_args(["board", *flags])
    with pytest.raises(UsageError, match=field):
        board.run(None, args, lambda *_: {}, lambda _: None)  # type: ignore[arg-type, return-value]


def test_envoy_and_its_pickers_are_drawn_as_the_native_path() -> None:
    native = (g.Proxy("envoy", "east", "cp-1", True, 0, None, None, 2.0, kind="envoy"),
              g.Proxy("picker-1", "east", "cp-1", True, 0, 9.0, None, 2.0, kind="picker"),
              g.Proxy("picker-2", "east", "cp-1", True, 0, 0.0, None, 2.0, kind="picker"))
    snap = fleet()
    dot = g.to_dot(replace(snap, proxies=snap.proxies + native))
    found = edges(dot)
    labels = {(a, b): label for a, b, label, _ in found}
    envoy, picker = g.node_id("proxy", "envoy"), g.node_id("proxy", "picker-1")
    assert labels[(g.node_id("services", "east"), envoy)].startswith("OpenAI HTTP, KServe v2 gRPC")
    assert "9.0 req/s" in labels[(g.node_id("services", "east"), envoy)]  # what its pickers decided
    assert labels[(envoy, picker)].startswith("ext_proc: where to?")
    assert labels[(envoy, g.node_id("node", "n1"))].startswith("same bytes, untouched")
    assert labels[(picker, g.node_id("tiers", "east"))].startswith("admit")
    assert (picker, g.node_id("services", "east")) not in labels  # no token crosses a picker
    assert "Envoy envoy" in nodes(dot)[envoy] and "picker picker-1" in nodes(dot)[picker]


@pytest.mark.parametrize(("proxy_id", "kind"), [("envoy", "envoy"), ("pod-7-envoy", "envoy"), ("picker-2", "picker"),
                                                ("pod-7-picker-1", "picker"), ("proxy-1", "proxy")],
                         ids=["envoy", "pod-envoy", "picker", "pod-picker", "proxy"])
def test_a_table_consumer_is_known_by_its_id(proxy_id: str, kind: str) -> None:
    assert g.kind_of(proxy_id) == kind
