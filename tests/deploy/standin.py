"""A stand-in for the Triton container of the example GPU pod: one simulated replica (KServe v2 gRPC).

``python -m tests.deploy.standin MODEL --ready-file PATH`` serves MODEL
(version v1) with a fast engine on 127.0.0.1 and writes ``{"pid",
"address", "metrics_url"}`` once it serves; the agent sidecar adopts it
through ``--triton`` as it would a Triton server. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from agent.replica.engine import EngineParams
from agent.replica.server import SimulatedReplica
from ferry.process import die_with_parent, stop_event, write_ready_file
from tools.process_fleet import FAST_REPLICA


async def serve(model: str, ready_file: str) -> None:
    """Serve one simulated replica of ``model`` until SIGTERM."""
    stop = stop_event()
    async with SimulatedReplica(model, "v1", params=EngineParams(**FAST_REPLICA)) as replica:
        write_ready_file(ready_file, {"pid": os.getpid(), "address": replica.address,
                                      "metrics_url": replica.metrics_url})
        await stop.wait()


def main() -> None:
    """Parse the arguments, die with the parent test, serve."""
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.standin")
    parser.add_argument("model")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    if os.environ.get("FERRY_PARENT_PID", "").isdigit():
        die_with_parent(int(os.environ.pop("FERRY_PARENT_PID")))
    asyncio.run(serve(args.model, args.ready_file))


if __name__ == "__main__":
    main()
