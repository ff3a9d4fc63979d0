"""``ferryctl top``: a live view per model and region, refreshed every second.

Each frame asks ``Admin.GetUsage(by_tier=true)`` of the leader once
(:func:`ferry_cli.ctl.flow.leader`). Columns:

- from the proxies' usage reports over their last window (one second,
  merged by the leader, :mod:`controlplane.tables.usage`): ``rate_per_s`` (requests
  ended per second, shed ones not included), ``p99_ms`` (of the requests
  answered OK; the highest proxy's, an upper bound; ``-`` when none was
  answered), ``shed`` (shed / offered, 0..1), ``errors`` (failed / ended)
  and ``guard_ms`` (the guardrail hooks' mean time per request,
  :mod:`dataplane.guard.hooks`; ``-`` when no hook ran);
- ``queue``: waiting in the replicas' queues (agent telemetry) plus in the
  proxies' tier queues (reports); ``running``, ``kv_util``, ``gpu_util``,
  ``ready`` and ``telemetry_age_s`` from agent telemetry.

``--by-tier`` adds, after each model's row (tier ``all``), a row per tier
the proxies reported, with the proxies' figures only (its queue: the
proxies' queue of that tier). ``--json`` rows also carry
``replica_rate_per_s``: completed requests per second from the change of
the replicas' ``requests_total`` between two frames (a counter that went
back, a restart, counts as zero); so the first frame waits one interval.

Each frame also names the proxies (``proxies``: every control plane's
``GetStatus``): a dead, disconnected proxy is shown as such, so that its
missing traffic does not read as an idle fleet (``--json``: ``proxies``, one
object per proxy with ``connected``).

Human frames are separated by a blank line (the screen is cleared first when
stdout is a terminal); ``--json`` prints one JSON object per frame and line.
Stops after ``--iterations`` frames, or on Ctrl-C / SIGTERM with exit 0.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ferry.v1 import admin_pb2
from ferry_cli.ctl.flow import human, p99_ms
from ferry_cli.ctl.views import print_table

ALL = "all"
COLUMNS = ["model", "region", "ready", "rate_per_s", "p99_ms", "guard_ms", "queue", "running", "kv_util", "gpu_util",
           "shed", "errors", "telemetry_age_s"]


def _proxy_figures(r: Any) -> dict[str, Any]:
    return {"rate_per_s": round(r.request_rate, 2), "p99_ms": p99_ms(r.p99_seconds), "shed": round(r.shed_rate, 4),
            "errors": round(r.error_rate, 4), "guard_ms": round(r.guard_seconds * 1000, 2) if r.guard_seconds else None}


def frame_rows(previous: Any, current: Any, *, by_tier: bool = False) -> list[dict[str, Any]]:
    """Rows of one frame from two ``GetUsageResponse`` samples (``previous`` may be None)."""
    before = ({(r.model, r.region): r.requests_total for r in previous.rows if not r.tier}
              if previous is not None else {})
    elapsed = current.sampled_at - previous.sampled_at if previous is not None else 0.0
    proxy_queued: dict[tuple[str, str], int] = {}
    for r in current.rows:
        if r.tier:
            proxy_queued[(r.model, r.region)] = proxy_queued.get((r.model, r.region), 0) + r.queued
    rows = []
    for r in current.rows:
        if r.tier:
            if by_tier:
                rows.append({"model": r.model, "region": r.region, "tier": r.tier, "ready": None,
                             **_proxy_figures(r), "queue": r.queued, "running": None, "kv_util": None,
                             "gpu_util": None, "telemetry_age_s": None})
            continue
        done = r.requests_total - before.get((r.model, r.region), r.requests_total)
        waiting = proxy_queued.get((r.model, r.region), 0)
        rows.append({
            "model": r.model, "region": r.region, "tier": ALL, "ready": f"{r.replicas_ready}/{r.replicas}",
            **_proxy_figures(r), "queue": r.queued + waiting, "queue_replicas": r.queued, "queue_proxies": waiting,
            "running": r.running, "kv_util": round(r.kv_utilisation, 3), "gpu_util": round(r.gpu_utilisation, 3),
            "telemetry_age_s": round(r.telemetry_age_seconds, 2), "requests_total": r.requests_total,
            "replica_rate_per_s": round(max(0, done) / elapsed, 2) if elapsed > 0 else None,
        })
    return rows


def run(stub: Any, *, iterations: int, interval: float, as_json: bool, timeout: float, by_tier: bool = False,
        proxies: Callable[[], list[dict[str, Any]]] = list,
        summary: Callable[[list[dict[str, Any]]], str] = lambda p: "") -> None:
    """Print frames until ``iterations`` (0: forever) or a stop signal; ``proxies`` gives each frame's proxies."""
    stop = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    clear = sys.stdout.isatty() and not as_json
    request = admin_pb2.GetUsageRequest(by_tier=True)  # tier rows carry the proxies' queues
    columns = [*COLUMNS[:2], "tier", *COLUMNS[2:]] if by_tier else COLUMNS
    try:
        previous = stub.GetUsage(request, timeout=timeout)
        shown = 0
        while not stop.wait(interval):
            current = stub.GetUsage(request, timeout=timeout)
            rows = frame_rows(previous, current, by_tier=by_tier)
            previous = current
            shown += 1
            stamp = time.strftime("%H:%M:%S", time.localtime(current.sampled_at))
            known = proxies()
            if as_json:
                print(json.dumps({"at": current.sampled_at, "rows": rows, "proxies": known}), flush=True)
            else:
                if clear:
                    print("\033[H\033[2J", end="")
                elif shown > 1:
                    print()
                print(f"ferryctl top  {stamp}  (rate, p99, shed, errors: the proxies' last window)")
                if known:
                    print(summary(known))
                print_table(human(rows), columns)
                sys.stdout.flush()
            if iterations and shown >= iterations:
                return
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
