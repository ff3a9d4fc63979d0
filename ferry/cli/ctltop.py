"""``ferryctl top``: a live view per model and region, refreshed every second.

Each frame asks ``Admin.GetUsage`` once. The request rate is computed here
from the change of ``requests_total`` (completed requests, summed over the
model's replicas in the region, as their agents last reported) between two
frames, divided by the change of the control plane's ``sampled_at``; a
replica whose counter went back (restarted) counts as zero. The first frame
waits one interval for a second sample, so every frame has a rate.

What the control plane knows and shows: replicas ready/registered, rate,
queue, running, KV and GPU utilisation, the oldest telemetry. What it does
not know: latency and shedding happen in the proxies, which report neither
to the control plane yet, so ``p99`` and ``shed`` are ``n/a``
(docs/operations.md proposes the proxies' report that would fill them).

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
from typing import Any

from ferry.cli.ctlviews import print_table
from ferry.v1 import admin_pb2

NA = "n/a"
COLUMNS = ["model", "region", "ready", "rate_per_s", "p99_ms", "queue", "running", "kv_util", "gpu_util", "shed",
           "telemetry_age_s"]


def frame_rows(previous: Any, current: Any) -> list[dict[str, Any]]:
    """Rows of one frame from two ``GetUsageResponse`` samples (``previous`` may be None)."""
    before = {(r.model, r.region): r.requests_total for r in previous.rows} if previous is not None else {}
    elapsed = current.sampled_at - previous.sampled_at if previous is not None else 0.0
    rows = []
    for r in current.rows:
        done = r.requests_total - before.get((r.model, r.region), r.requests_total)
        rate = round(max(0, done) / elapsed, 2) if elapsed > 0 else None
        rows.append({
            "model": r.model, "region": r.region, "ready": f"{r.replicas_ready}/{r.replicas}",
            "rate_per_s": rate, "p99_ms": NA, "queue": r.queued, "running": r.running,
            "kv_util": round(r.kv_utilisation, 3), "gpu_util": round(r.gpu_utilisation, 3), "shed": NA,
            "telemetry_age_s": round(r.telemetry_age_seconds, 2), "requests_total": r.requests_total,
        })
    return rows


def run(stub: Any, *, iterations: int, interval: float, as_json: bool, timeout: float) -> None:
    """Print frames until ``iterations`` (0: forever) or a stop signal."""
    stop = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    clear = sys.stdout.isatty() and not as_json
    try:
        previous = stub.GetUsage(admin_pb2.GetUsageRequest(), timeout=timeout)
        shown = 0
        while not stop.wait(interval):
            current = stub.GetUsage(admin_pb2.GetUsageRequest(), timeout=timeout)
            rows = frame_rows(previous, current)
            previous = current
            shown += 1
            stamp = time.strftime("%H:%M:%S", time.localtime(current.sampled_at))
            if as_json:
                print(json.dumps({"at": current.sampled_at, "rows": rows}), flush=True)
            else:
                if clear:
                    print("\033[H\033[2J", end="")
                elif shown > 1:
                    print()
                print(f"ferryctl top  {stamp}  (p99 and shed: n/a until proxies report them)")
                print_table(rows, COLUMNS)
                sys.stdout.flush()
            if iterations and shown >= iterations:
                return
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
