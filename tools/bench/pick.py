"""Per-decision cost of the pick: :func:`dataplane.pick.decide.decide`, and with its step metrics on.

Times the decision with the default plan, and with the step timer of the
proxy's metrics on (:class:`dataplane.metrics.PickSteps`, when the tree has
it), on one view: a pool of ``--replicas`` replicas with random loads, for
three kinds of request (a known prefix key going back to its replica, a new
key placed on its walk, no key: P2C). Median of ``--repeat`` rounds of
``--decisions`` decisions, µs per decision. With ``--baseline`` (the JSON
this bench wrote on another tree: run it there, e.g. on ``git archive`` of the
commit before the plug-ins), each case's difference is printed and kept.
Prints one line per case and writes ``bench-results/pick.json``.

Usage: ``python -m tools.bench.pick [--replicas 16] [--decisions 2000] [--repeat 7] [--baseline PATH] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from dataplane.metrics import ProxyMetrics
from dataplane.pick.decide import DEFAULT_DECIDE, Ask, Local, Placements, Routing, View, decide
from dataplane.pick.p2c import LocalLoad, Need
from dataplane.regions.remote import EMPTY
from dataplane.table.local import build_table
from dataplane.table.pool import Replica, make_pool
from ferry.v1 import tables_pb2

ROOT = Path(__file__).resolve().parents[2]


def _cases(replicas: int, rng: random.Random) -> dict[str, tuple[Ask, Callable[[], Local]]]:
    reps = [Replica(replica_id=f"r{i}", address=f"h:{i}", kserve_model="m", version="v1", node=f"n{i % 4}",
                    max_concurrency=8, kv_block_tokens=16, max_context_tokens=32768, queued=rng.randrange(4),
                    running=rng.randrange(8), kv_blocks_free=rng.randrange(200, 1000), kv_blocks_total=1000,
                    telemetry_age=rng.random(), smoothed=rng.random() * 8) for i in range(replicas)]
    pool = make_pool("m/v1", reps, vnodes=128, load_factor=1.25, rings={})
    load = LocalLoad()
    for r in reps:
        for _ in range(rng.randrange(3)):
            load.add(r.replica_id, rng.randrange(2000))
    known, new = 0x9E3779B97F4A7C15, 0x1234567890ABCDEF
    placements = Placements()
    placements.put(known, reps[next(pool.ring.walk(known))].replica_id)

    def local() -> Local:
        return Local(load, frozenset(), 50_000.0, placements, None, 4, 1000.0)

    need = Need(3000, 2000)
    return {"known-key": (Ask(routing=Routing("v1", pool, known, need)), local),
            "new-key": (Ask(routing=Routing("v1", pool, new, need)), local),
            "no-key": (Ask(routing=Routing("v1", pool, None, need)), local)}


def _time(view: View, ask: Ask, local: Local, rng: random.Random, decisions: int, repeat: int) -> float:
    """Median over ``repeat`` rounds of µs per :func:`decide` call."""
    rounds = []
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(decisions):
            decide(view, ask, local, rng, 0.5)
        rounds.append((time.perf_counter() - began) / decisions * 1e6)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--decisions", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--baseline", default="", help="a JSON this bench wrote on another tree, to compare with")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "pick.json"))
    args = p.parse_args(argv)
    baseline = json.loads(Path(args.baseline).read_text())["cases"] if args.baseline else {}
    table = build_table(tables_pb2.TableSnapshot(version=1, nonce="n", region="local"), region="local",
                        applied_at=0.0)
    view = View(table, EMPTY, DEFAULT_DECIDE)
    steps = getattr(ProxyMetrics(CollectorRegistry()), "pick_steps", None)  # None on a tree without them
    rng = random.Random(1)
    results: dict[str, dict[str, Any]] = {}
    for case, (ask, local) in _cases(args.replicas, random.Random(7)).items():
        state = local()
        row: dict[str, Any] = {"decide_us": _time(view, ask, state, rng, args.decisions, args.repeat)}
        line = f"{case:10s} decide {row['decide_us']:6.2f} µs"
        if steps is not None:
            timed = Local(state.load, state.ejected, state.detour, state.placements, None, state.choices,
                          state.place_margin, steps)
            row["decide_timed_us"] = _time(view, ask, timed, rng, args.decisions, args.repeat)
            line += f"  with step metrics {row['decide_timed_us']:6.2f} µs"
        if case in baseline:
            row["baseline_us"] = base = baseline[case]["decide_us"]
            row["overhead_us"] = row["decide_us"] - base
            line += f"  baseline {base:6.2f} µs (composed {row['overhead_us']:+.2f} µs"
            if "decide_timed_us" in row:
                row["timed_overhead_us"] = row["decide_timed_us"] - base
                line += f", with step metrics {row['timed_overhead_us']:+.2f} µs"
            line += ")"
        row["branch"] = decide(view, ask, state, random.Random(1), 0.5).branch.value
        results[case] = row
        print(f"{line}  [{row['branch']}]")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"replicas": args.replicas, "decisions": args.decisions, "repeat": args.repeat,
                               "python": sys.version.split()[0], "cases": results}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
