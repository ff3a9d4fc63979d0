"""``make demo``: run ``ferry up``, replay the first minutes of a trace through it, print what happened.

Starts ``ferry up`` (one control plane, one proxy, four nodes with eight
simulated replicas of two models, each its own process), waits for its ready
file, shows ``ferryctl replicas``, replays the first ``--minutes`` of the
Mooncake conversation trace at ``--speedup`` with a progress bar (from
``traces/`` when ``python -m tools.fetch_traces`` put it there, else the
bundled excerpt of its first two minutes in ``tools/data``; the replay
names the file), prints the
report (also written to ``bench-results/demo.json``), shows the replicas again
and stops everything. Exits non-zero if any request failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from ferry.cli.ctl import main as ctl
from ferry.procs import Child, ChildFailed
from tools import replay
from tools.fetch_traces import default_trace, trace_file

ROOT = Path(__file__).resolve().parent.parent
TRACE = default_trace()  # traces/mooncake_conversation_trace.jsonl if fetched, else its bundled first 2 minutes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", type=trace_file, default=str(TRACE))
    p.add_argument("--minutes", default="2")
    p.add_argument("--speedup", default="4")
    p.add_argument("--replicas", default="8")
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with tempfile.TemporaryDirectory(prefix="ferry-demo-") as tmp:
        workdir = Path(tmp)
        up = Child("up", ["up", "--replicas", args.replicas, "--workdir", str(workdir / "fleet")], workdir).start()
        try:
            try:
                ready = up.wait_ready(90)
            except ChildFailed as exc:
                print(f"demo: ferry up failed: {exc}", file=sys.stderr)
                return 1
            print(f"ferry up is ready: data plane {ready['data_plane']}, control plane {ready['control_plane']}, "
                  f"{len(ready['replicas'])} replicas of {', '.join(ready['models'])}\n")
            ctl.main(["--ready-file", str(up.ready_path), "replicas"])
            print()
            code = replay.main(["--trace", args.trace, "--ready-file", str(up.ready_path),
                                "--minutes", args.minutes, "--speedup", args.speedup,
                                "--json-out", str(ROOT / "bench-results" / "demo.json"),
                                "--plots", str(ROOT / "bench-results" / "demo")])
            time.sleep(1.0)  # one telemetry interval: the table shows the fleet settled, not the last steps
            print("\nreplicas after the run (ferryctl replicas):")
            ctl.main(["--ready-file", str(up.ready_path), "replicas"])
            print(f"\nreport written to {ROOT / 'bench-results' / 'demo.json'}")
            return code
        finally:
            up.stop(timeout=15)


if __name__ == "__main__":
    sys.exit(main())
