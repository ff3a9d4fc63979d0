"""``ferryctl board``: the running fleet drawn as a picture (SVG and PNG), once or every few seconds.

``ferryctl board [--out DIR] [--window S] [--watch [--interval S] [--count N]]``
writes ``DIR/board.dot``, ``DIR/board.svg`` and ``DIR/board.png`` (each
replaced whole, so a viewer never reads half a file). What the picture shows
and how it is laid out: :mod:`ferry_cli.ctl.boardgraph` (pure: a
:class:`~ferry_cli.ctl.boardgraph.Snapshot` to DOT); this module is the edge
that fetches, measures and renders.

A frame is two samples :class:`Sample` ``--window`` seconds apart (with
``--watch``, the previous frame's sample and a new one ``--interval``
seconds later); :func:`snapshot` (pure) turns them into rates. Each sample
asks the Admin API what ``status``, ``nodes``, ``replicas``, ``tiers`` and
``spill`` ask (the same merged status of every control plane,
:func:`ferry_cli.ctl.fleet.gather_status`, and the same rows,
:mod:`ferry_cli.ctl.views` and :mod:`ferry_cli.ctl.flow`, of the leader),
and scrapes the Prometheus endpoints ``ferry up``'s ready file lists
(``metrics``), parsed by :mod:`agent.scrape` (``prometheus_client``'s parser). Rates:

- requests/s into a proxy and tokens/s it streams back: the change of its
  ``ferry_proxy_requests_total`` and ``ferry_proxy_generation_tokens_total``;
  without its metrics, the requests its region's proxies report to the
  leader (``top``'s rate, :func:`ferry_cli.ctl.top.frame_rows`) shared
  evenly, and tokens unmeasured (``?``);
- requests/s into a node: the change of its replicas' ``requests_total``
  (agent telemetry), the way ``top`` counts ``replica_rate_per_s``;
- telemetry/s: the change of a control plane's
  ``ferry_controlplane_telemetry_messages_total``, shared among the agents
  connected to it; table pushes/s: the change of its
  ``ferry_controlplane_table_pushes_total`` of the proxy's region, shared
  among that region's proxies watching it;
- store revisions/s: the change of the store revision ``status`` reports;
  Admin calls/s: the calls this command made.

A counter that went back (a restart) counts as zero. A proxy's metrics are
matched to its id by the ready file's child name (``proxy`` is ``proxy-1``
when alone). Bounds: at most :data:`MAX_ENDPOINTS` endpoints scraped,
:data:`MAX_PAGE_BYTES` read from each within :data:`SCRAPE_TIMEOUT`; ``dot``
runs at most :data:`RENDER_TIMEOUT` seconds. ``dot`` (Debian's ``graphviz``)
must be on PATH (``make graphviz`` installs it): without it the command
exits 2 saying so. ``--json`` prints one object a frame: the files and the
snapshot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from agent.scrape import Samples, parse
from ferry.process import read_ready_file
from ferry.v1 import admin_pb2
from ferry_cli.ctl import boardgraph as g
from ferry_cli.ctl import flow as ctlflow
from ferry_cli.ctl import top as ctltop
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.views import node_row, replica_row

HELP = "draw the running fleet (SVG and PNG): components, flows with live rates, requirements served"
TIMEOUT = 5.0
SCRAPE_TIMEOUT = 2.0
RENDER_TIMEOUT = 60.0
MAX_ENDPOINTS = 64
MAX_PAGE_BYTES = 8 << 20
FORMATS = ("svg", "png")
PROXY_REQUESTS = "ferry_proxy_requests_total"
PROXY_TOKENS = "ferry_proxy_generation_tokens_total"
TELEMETRY = "ferry_controlplane_telemetry_messages_total"
PUSHES = "ferry_controlplane_table_pushes_total"
METRICS = frozenset({PROXY_REQUESTS, PROXY_TOKENS, TELEMETRY, PUSHES})

StatusFn = Callable[[Any, argparse.Namespace], dict[str, Any]]
Connect = Callable[[str], AbstractContextManager[Any]]


@dataclasses.dataclass(frozen=True)
class Sample:
    """What one look at the fleet saw: Admin answers as rows, counters from metrics, at a monotonic time."""

    at: float
    status: dict[str, Any]                     # gather_status's merged view
    nodes: list[dict[str, Any]]                # views.node_row
    replicas: list[dict[str, Any]]             # views.replica_row
    served: dict[str, int]                     # replica id -> requests_total (telemetry)
    tiers: list[dict[str, Any]]                # flow.tier_row
    spills: list[dict[str, Any]]               # flow.spill_row
    usage: Any                                 # GetUsageResponse (top's rates)
    counters: dict[tuple[str, ...], float]     # (metric, component id[, region]) -> value
    admin_calls: int                           # Admin calls made by this command so far


def per_second(before: float | None, after: float | None, elapsed: float) -> float | None:
    """The rate of a counter between two samples; None when either is unknown; a counter that went back is 0."""
    if before is None or after is None or elapsed <= 0:
        return None
    return max(0.0, after - before) / elapsed


def counters(pages: Mapping[str, str], proxy_ids: set[str], plane_ids: set[str]) -> dict[tuple[str, ...], float]:
    """The board's counters from metric pages (child name -> exposition text), keyed by component id.

    A page with proxy metrics belongs to the proxy of the child's name (``proxy`` alone is ``proxy-1``);
    one with control-plane metrics to the control plane of that name; others are ignored.
    """
    out: dict[tuple[str, ...], float] = {}
    for name, text in sorted(pages.items()):
        samples = Samples(parse(text, METRICS))
        proxy = name if name in proxy_ids else f"{name}-1" if f"{name}-1" in proxy_ids else ""
        if proxy and (PROXY_REQUESTS in samples or "ferry_proxy_" in text):
            out[(PROXY_REQUESTS, proxy)] = samples.get(PROXY_REQUESTS) or 0.0
            out[(PROXY_TOKENS, proxy)] = samples.get(PROXY_TOKENS) or 0.0
        if name in plane_ids and (TELEMETRY in samples or "ferry_controlplane_" in text):
            out[(TELEMETRY, name)] = samples.get(TELEMETRY) or 0.0
            for s in samples.all(PUSHES):
                out[(PUSHES, name, s.labels.get("region", ""))] = s.value
    return out


def _region_rates(before: Sample, after: Sample) -> dict[str, float]:
    """Requests/s per region as the proxies report them to the leader (``top``'s rows, every model)."""
    rates: dict[str, float] = {}
    for row in ctltop.frame_rows(before.usage, after.usage):
        if row.get("tier") == ctltop.ALL and row.get("rate_per_s") is not None:
            rates[row["region"]] = rates.get(row["region"], 0.0) + float(row["rate_per_s"])
    return rates


def snapshot(before: Sample, after: Sample, title: str = "Ferry") -> g.Snapshot:
    """The board's snapshot at ``after``, with rates over ``after.at - before.at`` (pure)."""
    dt = after.at - before.at
    st = after.status
    leader_id = (st.get("leader") or {}).get("id", "")
    planes = []
    nodes_at = {n["node"]: n for n in after.nodes}
    for c in st["control_planes"]:
        telemetry = per_second(before.counters.get((TELEMETRY, c["id"])), after.counters.get((TELEMETRY, c["id"])),
                               dt)
        planes.append(g.ControlPlane(c["id"] or c["address"], c["address"], c["id"] == leader_id and bool(leader_id),
                                     bool(c["reachable"]), c["role"], int(c["agents"]), telemetry))
    by_id = {p.id: p for p in planes}
    store = st["store"]
    revisions = per_second(float(before.status["store"]["revision"]), float(store["revision"]), dt)
    # one row a proxy: the connected one when a proxy was seen by several control planes
    rows: dict[str, dict[str, Any]] = {}
    for p in st["proxies"]:
        if p["proxy_id"] not in rows or (p["connected"] and not rows[p["proxy_id"]]["connected"]):
            rows[p["proxy_id"]] = p
    region_rates = _region_rates(before, after)
    live_in_region: dict[str, int] = {}
    watching: dict[tuple[str, str], int] = {}
    for p in rows.values():
        if p["connected"] and g.kind_of(p["proxy_id"]) != "envoy":  # Envoy reports no usage: not a share
            live_in_region[p["region"]] = live_in_region.get(p["region"], 0) + 1
            watching[(p["control_plane"], p["region"])] = watching.get((p["control_plane"], p["region"]), 0) + 1
    proxies = []
    for pid, p in sorted(rows.items()):
        requests = per_second(before.counters.get((PROXY_REQUESTS, pid)), after.counters.get((PROXY_REQUESTS, pid)),
                              dt)
        tokens = per_second(before.counters.get((PROXY_TOKENS, pid)), after.counters.get((PROXY_TOKENS, pid)), dt)
        kind = g.kind_of(pid)
        if requests is None and p["region"] in region_rates and kind != "envoy":
            requests = region_rates[p["region"]] / max(1, live_in_region.get(p["region"], 0))
        key = (PUSHES, p["control_plane"], p["region"])
        pushes = per_second(before.counters.get(key), after.counters.get(key), dt)
        if pushes is not None:
            pushes /= max(1, watching.get((p["control_plane"], p["region"]), 0))
        if not p["connected"]:
            requests, tokens, pushes = 0.0, 0.0, 0.0
        proxies.append(g.Proxy(pid, p["region"], p["control_plane"], bool(p["connected"]), int(p["lag_versions"]),
                               requests, tokens, pushes, kind=kind))
    agents: dict[str, int] = {}
    for n in after.nodes:
        if n["agent_connected"] and n["live"]:
            agents[n["control_plane"]] = agents.get(n["control_plane"], 0) + 1
    states = {r["id"]: r for r in after.replicas}
    nodes = []
    for name, n in sorted(nodes_at.items()):
        replicas = tuple(g.Replica(rid, states[rid]["model"], states[rid]["version"], states[rid]["state"])
                         for rid in n["replica_ids"] if rid in states)
        done = [per_second(before.served.get(rid), after.served.get(rid), dt) for rid in n["replica_ids"]]
        requests = sum(d for d in done if d is not None) if any(d is not None for d in done) else None
        plane = by_id.get(n["control_plane"])
        telemetry = (plane.telemetry_per_s / max(1, agents.get(plane.id, 0))
                     if plane is not None and plane.telemetry_per_s is not None else None)
        if not (n["live"] and n["agent_connected"]):
            requests, telemetry = (requests if n["live"] else 0.0), 0.0
        nodes.append(g.Node(name, n["region"], int(n["gpus"]), bool(n["live"]), bool(n["agent_connected"]),
                            n["control_plane"], bool(n["cordoned"]), replicas, requests, telemetry))
    tiers = tuple(g.TierQueue(t["region"], t["tier"], int(t["queue"]), float(t["rate_per_s"]), int(t["reserved"]),
                              int(t["lent"])) for t in after.tiers)
    spills = tuple(g.Spill(s["source"], s["target"], float(s["weight"]), float(s["spilled_per_s"]))
                   for s in after.spills)
    return g.Snapshot(tuple(planes), g.Store(store["backend"], store["endpoint"], bool(store["healthy"]), revisions),
                      tuple(proxies), tuple(nodes), tiers, spills,
                      per_second(float(before.admin_calls), float(after.admin_calls), dt), title)


def scrape(address: str) -> str | None:
    """The metrics page at ``address`` (host:port), at most :data:`MAX_PAGE_BYTES`; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT) as page:
            return bytes(page.read(MAX_PAGE_BYTES)).decode(errors="replace")
    except (OSError, ValueError):
        return None


class Sampler:
    """Takes :class:`Sample` s of one fleet: Admin calls through ``stub`` (the leader's, via ``connect``) and
    the metric endpoints of ``endpoints`` (child name -> host:port); counts its own Admin calls."""

    def __init__(self, stub: Any, args: argparse.Namespace, status: StatusFn, connect: Connect,
                 endpoints: Mapping[str, str]) -> None:
        self._stub, self._args, self._status, self._connect = stub, args, status, connect
        self._endpoints = dict(sorted(endpoints.items())[:MAX_ENDPOINTS])
        self.calls = 0

    def take(self) -> Sample:
        """One sample now."""
        merged = self._status(self._stub, self._args)
        self.calls += 1 + len(merged["control_planes"])
        with ctlflow.leader(self._stub, self._connect, TIMEOUT) as target:
            nodes = target.ListNodes(admin_pb2.ListNodesRequest(), timeout=TIMEOUT).nodes
            replicas = target.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=TIMEOUT).replicas
            usage = target.GetUsage(admin_pb2.GetUsageRequest(by_tier=True), timeout=TIMEOUT)
            tiers = target.GetTiers(admin_pb2.GetTiersRequest(), timeout=TIMEOUT).tiers
            spills = target.GetSpill(admin_pb2.GetSpillRequest(), timeout=TIMEOUT).pairs
        self.calls += 6
        pages = {name: text for name, address in self._endpoints.items()
                 if address and (text := scrape(address)) is not None}
        return Sample(
            at=time.monotonic(), status=merged, nodes=[node_row(n) for n in nodes],
            replicas=[replica_row(r) for r in replicas], served={r.replica_id: r.load.requests_total for r in replicas},
            tiers=[ctlflow.tier_row(t) for t in tiers], spills=[ctlflow.spill_row(p) for p in spills], usage=usage,
            counters=counters(pages, {p["proxy_id"] for p in merged["proxies"]},
                              {c["id"] for c in merged["control_planes"]}),
            admin_calls=self.calls)


def render(dot_source: str, out: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write ``board.dot`` and ``board.<format>`` for each format into ``out`` with Graphviz's ``dot``;
    each file is written beside and renamed over the old one."""
    binary = shutil.which("dot")
    if binary is None:
        raise UsageError("graphviz's dot is not on PATH: install it (apt-get install graphviz, or make graphviz)")
    source = out / "board.dot"
    tmp = out / ".board.dot.tmp"
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(dot_source)
        os.replace(tmp, source)
    except OSError as exc:
        raise UsageError(f"board: cannot write into --out {out}: {exc}") from exc
    written = [source]
    for fmt in formats:
        target = out / f"board.{fmt}"
        tmp = out / f".board.{fmt}.tmp"
        result = subprocess.run([binary, f"-T{fmt}", "-o", str(tmp), str(source)], capture_output=True, text=True,
                                timeout=RENDER_TIMEOUT, check=False)
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise UsageError(f"dot could not render {source} as {fmt}: {result.stderr.strip()[:500]}")
        os.replace(tmp, target)
        written.append(target)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``board`` command's flags."""
    parser.add_argument("--out", default=".", help="directory for board.dot, board.svg, board.png (default .)")
    parser.add_argument("--window", type=float, default=2.0,
                        help="seconds between the two samples of the first frame's rates (default 2)")
    parser.add_argument("--watch", action="store_true", help="redraw every --interval seconds")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between frames with --watch (default 5)")
    parser.add_argument("--count", type=int, default=0, help="frames to draw with --watch, then exit (0: until "
                                                             "Ctrl-C)")
    parser.add_argument("--title", default="", help="the picture's title (default: Ferry and the time)")


def endpoints(args: argparse.Namespace) -> dict[str, str]:
    """The metric endpoints of ``--ready-file`` (``metrics``: child name -> host:port); none without one."""
    ready = (read_ready_file(args.ready_file) or {}) if getattr(args, "ready_file", None) else {}
    found = ready.get("metrics") or {}
    return {str(k): str(v) for k, v in found.items() if v} if isinstance(found, dict) else {}


def run(stub: Any, args: argparse.Namespace, status: StatusFn, connect: Connect) -> None:
    """``ferryctl board``: draw one frame, or ``--count`` frames every ``--interval`` seconds with ``--watch``."""
    if args.window <= 0:
        raise UsageError("board: --window must be > 0 seconds")
    if args.interval <= 0:
        raise UsageError("board: --interval must be > 0 seconds")
    if args.count < 0:
        raise UsageError("board: --count must be >= 0")
    if shutil.which("dot") is None:
        raise UsageError("graphviz's dot is not on PATH: install it (apt-get install graphviz, or make graphviz)")
    out = Path(args.out)
    sampler = Sampler(stub, args, status, connect, endpoints(args))
    stop = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        before = sampler.take()
        wait = args.window
        drawn = 0
        while not stop.wait(wait):
            after = sampler.take()
            title = args.title or f"Ferry - {time.strftime('%Y-%m-%d %H:%M:%S')}"
            snap = snapshot(before, after, title)
            files = render(g.to_dot(snap), out)
            drawn += 1
            if args.json:
                print(json.dumps({"files": [str(f) for f in files], "snapshot": dataclasses.asdict(snap)}),
                      flush=True)
            else:
                print(f"board: {', '.join(str(f) for f in files[1:])} ({len(snap.nodes)} nodes, "
                      f"{len(snap.proxies)} proxies, {len(g.flows(snap))} flows)", flush=True)
            if not args.watch or (args.count and drawn >= args.count):
                return
            before, wait = after, args.interval
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
