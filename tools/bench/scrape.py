"""The metrics scrape's parse cost: ``prometheus_client``'s parser (:func:`agent.scrape.parse`) against the old one.

``python -m tools.bench.scrape`` builds three expositions as the agent and
``ferryctl board`` read them:

- **triton**: one Triton-style endpoint serving ``--models`` (8) models, each
  the text of a simulated replica (:func:`agent.replica.metrics.render`:
  Triton's ``nv_inference_*`` counters and TensorRT-LLM's
  ``nv_trt_llm_*`` gauges, ferry's step and prefix counters) after a few
  hundred requests;
- **batch**: a batch runtime's page (:class:`agent.batch.metrics.BatchMetrics`:
  Triton's names and a histogram of batch sizes with 13 buckets) for 8 models;
- **vllm**: a vLLM-style page written by ``prometheus_client`` under vLLM's
  metric names (``vllm:num_requests_running`` ..., the TTFT, end-to-end and
  token histograms of 20 to 30 buckets, ``model_name`` labels) for 4 models.

For each, the CPU time of one parse (the median of ``--repeats`` (200) runs,
after one warm-up) of the whole text and with the families the agent's poll
reads (:data:`agent.triton.METRICS_READ`), by :func:`agent.scrape.parse`
and, for comparison, by the hand-written parser the agent used before
(``agent/promtext.py`` read from git at ``--old-rev``, skipped when git or
the revision is not at hand); and whether both give the same samples (name,
labels, value). Prints the figures and writes ``bench-results/scrape.json``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.batch.metrics import BatchMetrics
from agent.batch.telemetry import ModelView, RuntimeLoad
from agent.replica import metrics as replica_metrics
from agent.replica.engine import Engine, EngineParams, EngineRequest
from agent.replica.runner import RunnerStats
from agent.scrape import parse
from agent.triton import METRICS_READ

ROOT = Path(__file__).resolve().parents[2]
OLD_REV = "27ad061"  # the last commit with agent/promtext.py, the hand-written parser


def triton_page(models: int) -> str:
    """``models`` simulated replicas' texts on one page, each after some requests ran through its engine."""
    pages = []
    for m in range(models):
        engine = Engine(EngineParams())
        for i in range(40):
            engine.submit(EngineRequest(request_id=str(i), prompt_tokens=600 + 50 * i, max_tokens=64,
                                        block_hashes=tuple(range(i % 3, i % 3 + 4))), 0.0)
        now = 0.0
        for _ in range(30):
            took = engine.start_step(now)
            if took is None:
                break
            now += took
            engine.finish_step(now)
        stats = RunnerStats(success=300 + m, rejected=3, cancelled=1, queue_seconds=1.5, compute_seconds=40.0)
        pages.append(replica_metrics.render(model=f"model-{m}", version="1", load=engine.load(), stats=stats,
                                            utilization=0.6, gpu_uuid=f"GPU-{m}"))
    return "".join(pages)


def batch_page(models: int) -> str:
    """A batch runtime's page for ``models`` models, with batch sizes observed."""
    load = RuntimeLoad(models=tuple(ModelView(model=f"b{m}", version="1", ready=True, pending=m, running=2,
                                              max_concurrency=400, answered=500 + m, failed=1, batches=40)
                                    for m in range(models)),
                       gpu_utilization=tuple(0.5 for _ in range(8)), gpus_in_use=6, drain_idle_gpu_s=3.0)
    metrics = BatchMetrics(lambda: load)
    for m in range(models):
        for size in (1, 3, 8, 20, 64, 100):
            metrics.batch_size.labels(f"b{m}").observe(size)
        metrics.flushes.labels(f"b{m}", "size").inc(7)
        metrics.flushes.labels(f"b{m}", "time").inc(3)
    return metrics.render()


def vllm_page(models: int) -> str:
    """A vLLM-style page: its gauges, counters and latency/token histograms under vLLM's names."""
    r = CollectorRegistry()
    labels = ["model_name"]
    running = Gauge("vllm:num_requests_running", "Requests running.", labels, registry=r)
    waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", labels, registry=r)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV cache use.", labels, registry=r)
    success = Counter("vllm:request_success", "Requests finished.", [*labels, "finished_reason"], registry=r)
    prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", labels, registry=r)
    seconds = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0, 160.0)
    tokens = tuple(float(2 ** k) for k in range(1, 16)) + tuple(float(3 * 2 ** k) for k in range(1, 15))
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels, buckets=seconds, registry=r)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E.", labels, buckets=seconds, registry=r)
    tpot = Histogram("vllm:time_per_output_token_seconds", "TPOT.", labels, buckets=seconds, registry=r)
    sizes = Histogram("vllm:request_prompt_tokens", "Prompt sizes.", labels, buckets=sorted(tokens), registry=r)
    for m in range(models):
        name = f"meta-llama/Llama-3.1-8B-{m}"
        running.labels(name).set(12)
        waiting.labels(name).set(3)
        kv.labels(name).set(0.42)
        success.labels(name, "stop").inc(900)
        success.labels(name, "length").inc(40)
        prompt.labels(name).inc(1_200_000)
        for i in range(50):
            ttft.labels(name).observe(0.02 * (i % 9 + 1))
            e2e.labels(name).observe(0.5 * (i % 7 + 1))
            tpot.labels(name).observe(0.01 * (i % 5 + 1))
            sizes.labels(name).observe(100 * (i + 1))
    return str(generate_latest(r).decode())


def old_parser(rev: str) -> ModuleType | None:
    """The hand-written parser as of ``rev`` (from git), or None when it cannot be read."""
    try:
        text = subprocess.run(["git", "show", f"{rev}:agent/promtext.py"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "promtext_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("promtext_old", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["promtext_old"] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def timed(run: Callable[[], object], repeats: int) -> float:
    """The median CPU seconds of ``run`` over ``repeats`` runs, after one warm-up (CPU time: the machine is
    shared, and a parse does no I/O)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)


def rows(samples: list[Any]) -> list[tuple[str, tuple[tuple[str, str], ...], float | str]]:
    """Samples as comparable rows (NaN as a string, which equals itself)."""
    return [(s.name, tuple(sorted(s.labels.items())), "nan" if math.isnan(s.value) else float(s.value))
            for s in samples]


def measure(name: str, text: str, old: ModuleType | None, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"page": name, "bytes": len(text), "lines": text.count("\n"),
                           "samples": len(parse(text)), "samples_read": len(parse(text, METRICS_READ))}
    choices: tuple[tuple[str, Collection[str] | None], ...] = (("whole", None), ("read", METRICS_READ))
    for label, names in choices:
        out[f"new_{label}_us"] = round(1e6 * timed(functools.partial(parse, text, names), repeats), 1)
        if old is not None:
            out[f"old_{label}_us"] = round(1e6 * timed(functools.partial(old.parse, text, names), repeats), 1)
            out[f"ratio_{label}"] = round(out[f"new_{label}_us"] / out[f"old_{label}_us"], 2)
            out[f"same_samples_{label}"] = rows(parse(text, names)) == rows(old.parse(text, names))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_scrape", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--models", type=int, default=8, help="models on the Triton-style page (default 8)")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--old-rev", default=OLD_REV, help=f"git revision of the hand-written parser (default {OLD_REV})")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "scrape.json"))
    args = p.parse_args(argv)
    old = old_parser(args.old_rev)
    if old is None:
        print(f"the hand-written parser is not readable at {args.old_rev}: new parser only")
    pages = {"triton": triton_page(args.models), "batch": batch_page(8), "vllm": vllm_page(4)}
    results = [measure(name, text, old, args.repeats) for name, text in pages.items()]
    for r in results:
        line = (f"{r['page']}: {r['bytes']:,} bytes, {r['samples']} samples ({r['samples_read']} read by the poll); "
                f"prometheus_client {r['new_whole_us']:.0f} µs whole, {r['new_read_us']:.0f} µs the poll's families")
        if old is not None:
            line += (f"; hand-written {r['old_whole_us']:.0f} µs whole, {r['old_read_us']:.0f} µs the poll's "
                     f"(x{r['ratio_whole']:.2f}, x{r['ratio_read']:.2f}); same samples: "
                     f"{r['same_samples_whole'] and r['same_samples_read']}")
        print(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "scrape", "python": platform.python_version(), "repeats": args.repeats,
                               "old_rev": args.old_rev if old is not None else None, "pages": results}, indent=2)
                   + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
