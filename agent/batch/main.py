"""``ferry batch-runtime``: serve a fixed-batch function as a KServe v2 replica.

Hosts ``--function module:function`` (default the reference ``batchstring``)
as ``--model`` with its contract (``--max-batch``, ``--gpus-per-batch``,
``--batch-ms``) on a node of ``--gpus`` simulated GPUs. ``max_wait`` is
derived from ``--budget-ms`` (see :mod:`agent.batch.budget`) unless
``--max-wait-ms`` overrides it. ``--gang-model NAME`` also hosts the same
function as a model that needs all the node's GPUs per batch, so one node
serves a small and a large model. Writes ``--ready-file`` as JSON
``{"address", "metrics", "pid", "models"}`` once it serves; stops cleanly on
SIGTERM and SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from agent.batch import metrics
from agent.batch.budget import LatencyBudget, derive
from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.reference import DEFAULT_FUNCTION, load_function
from agent.batch.runtime import BatchRuntime, HostedModel
from agent.batch.server import serve
from ferry.errors import ConfigError
from ferry.process import stop_event, write_ready_file

log = logging.getLogger("ferry.batch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry batch-runtime", description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="KServe gRPC address (default %(default)s)")
    p.add_argument("--metrics-listen", default="127.0.0.1:0", help="Prometheus address (default %(default)s)")
    p.add_argument("--ready-file", help="write the bound addresses here as JSON once serving")
    p.add_argument("--function", default=DEFAULT_FUNCTION, help="batch function module:function (default %(default)s)")
    p.add_argument("--model", default="batchstring", help="model name (default %(default)s)")
    p.add_argument("--gang-model", help="also host the function as NAME, needing all the node's GPUs per batch")
    p.add_argument("--max-batch", type=int, default=100, help="inputs per batch at most (default %(default)s)")
    p.add_argument("--gpus-per-batch", type=int, default=1, help="GPUs one batch takes (default %(default)s)")
    p.add_argument("--gpus", type=int, default=8, help="the node's GPUs (default %(default)s)")
    p.add_argument("--budget-ms", type=float, default=500, help="P95 budget end to end (default %(default)s)")
    p.add_argument("--batch-ms", type=float, default=100, help="time of one batch (default %(default)s)")
    p.add_argument("--max-wait-ms", type=float, help="override the max_wait derived from the budget")
    p.add_argument("--max-pending", type=int, default=2000, help="pending requests per model (default %(default)s)")
    p.add_argument("--age-limit-ms", type=float, default=200, help="aging limit of the gang scheduler")
    p.add_argument("--no-aging", action="store_true", help="turn aging off (small batches may starve)")
    p.add_argument("--allow-fault-injection", action="store_true",
                   help="accept 'kill [N]' / 'restore N' on the reserved model ferry.fault")
    return p


def contracts(args: argparse.Namespace) -> list[ModelContract]:
    """The hosted models' contracts from the flags; raises ConfigError."""
    budget = LatencyBudget(budget_s=args.budget_ms / 1e3, batch_s=args.batch_ms / 1e3)
    wait = derive(budget).max_wait_s if args.max_wait_ms is None else args.max_wait_ms / 1e3
    common = {"max_batch": args.max_batch, "batch_s": args.batch_ms / 1e3, "max_wait_s": wait,
              "max_pending": args.max_pending}
    out = [ModelContract(name=args.model, gpus_per_batch=args.gpus_per_batch, **common)]
    if args.gang_model:
        out.append(ModelContract(name=args.gang_model, gpus_per_batch=args.gpus, **common))
    return out


async def run(args: argparse.Namespace) -> int:
    function = load_function(args.function)
    hosted = [HostedModel(c, function) for c in contracts(args)]
    scheduler = SchedulerConfig(gpus=args.gpus, aging=not args.no_aging, age_limit_s=args.age_limit_ms / 1e3)
    runtime = BatchRuntime(hosted, scheduler)
    await runtime.start()
    stop = stop_event()
    server, port = await serve(runtime, args.listen, allow_faults=args.allow_fault_injection)
    metrics_server, metrics_port = metrics.serve(args.metrics_listen)
    host = args.listen.rpartition(":")[0]
    metrics_host = args.metrics_listen.rpartition(":")[0]
    write_ready_file(args.ready_file, {"address": f"{host}:{port}", "metrics": f"{metrics_host}:{metrics_port}",
                                       "pid": os.getpid(), "models": runtime.models})
    log.info("batch runtime serving %s on %s:%d (max_wait %.1f ms)", runtime.models, host, port,
             hosted[0].contract.max_wait_s * 1e3)
    await stop.wait()
    await server.stop(grace=2.0)
    await runtime.stop()
    metrics_server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(run(args))
    except ConfigError as exc:
        print(f"ferry batch-runtime: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
