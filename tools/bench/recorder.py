"""The traffic recorder's CPU per request, in process: the hook at the proxy's count, then the report's share.

``python -m tools.bench.recorder`` builds ``--requests`` (100,000) synthetic
finished requests as the proxy holds them (:class:`dataplane.router.RequestState`:
a tenant, a validated request with ``--hashes`` (8) block hashes, an answer
with its tokens and time to first token, the replica and branch), then, per
rate of ``--rates`` (1.0, 0.1, 0.0):

- **hook**: :meth:`dataplane.record.recorder.Recorder.record` for each, as
  :meth:`dataplane.api.service.InferenceServicer.count` calls it (the sampler's
  CRC-32 below rate 1, the row for those sampled);
- **report**: the rows moved onto usage reports of ``record_report_rows``
  (2,000) and each report serialized in a ``WatchRequest``, as the table
  watch sends them (:mod:`dataplane.table.watch`).

- **blocks**: a recorded request's prompt is hashed in every 512-token block
  (``record_max_blocks``), where the decision alone hashes its first 16: the
  extra CPU of the blocks after the 16th as sketches
  (:func:`ferry.tokens.sketch_hashes`), and, for scale, were they hashed
  exactly, for the prompt
  lengths of ``--trace`` (the bundled Mooncake excerpt: mean 24 blocks), each
  prompt built as the replay builds it.

CPU is ``time.process_time`` over the whole run, divided per request and per
recorded request. The share is against the proxy's CPU per request measured
in docs/evaluation.md: about 1 ms a unary request (the workers bench) and 6
to 7 ms a streamed one (the peers bench); the default ``record_rate`` (1.0)
is kept while recording everything costs under 1 % of the smaller. Prints
the figures and writes ``bench-results/recorder.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from dataplane.forward.kserve import Outcome
from dataplane.intake.validate import ValidRequest
from dataplane.record.recorder import Recorder
from dataplane.router import RequestState
from ferry.config import TenantConfig
from ferry.tokens import BLOCK_TOKENS, chain_hashes, prompt_from_blocks, sketch_hashes, tokenize
from ferry.v1 import tables_pb2
from tools import trace as tracefile
from tools.fetch_traces import BUNDLED

ROOT = Path(__file__).resolve().parents[2]
PROXY_UNARY_SECONDS = 1.0e-3  # the proxy's CPU per unary request (docs/evaluation.md, the workers bench)
PROXY_STREAM_SECONDS = 6.5e-3  # per streamed request (docs/evaluation.md, the peers bench: 6 to 7 ms)
BUDGET = 0.01  # recording may cost at most this share of the proxy's CPU


def states(n: int, hashes: int) -> list[RequestState]:
    """``n`` finished requests of 20 tenants, two models and three tiers."""
    tenants = [TenantConfig(name=f"tenant-{i}", api_key_sha256="0" * 64) for i in range(20)]
    out = []
    for i in range(n):
        valid = ValidRequest(model=f"model-{i % 2}", version="", tier=("interactive", "standard", "batch")[i % 3],
                             prompt=b"", prompt_tokens=512 * hashes - 100, max_tokens=256, prefix_key="",
                             idempotency_key="", prefix_hashes=tuple((i * 7919 + d) * 2654435761 % 2**64
                                                                     for d in range(hashes)))
        s = RequestState(request_id=f"{i:032x}", started=0.0, model_label=valid.model, tier_label=valid.tier,
                         tenant=tenants[i % 20], request=valid, replica_id=f"node-{i % 16}-r0", branch="affinity",
                         streamed=bool(i % 2))
        s.outcome = Outcome(prompt_tokens=valid.prompt_tokens, completion_tokens=200, cached_tokens=1024,
                            ttft_seconds=0.08)
        out.append(s)
    return out


def measure(requests: list[RequestState], rate: float) -> dict[str, Any]:
    """The hook's and the reports' CPU for ``requests`` at ``rate``."""
    recorder = Recorder(rate=rate, max_rows=len(requests) + 1, report_rows=2000)
    start = time.process_time()
    for s in requests:
        recorder.record(s, "OK", 1.5)
    hook = time.process_time() - start
    recorded = len(recorder)
    start = time.process_time()
    sent = 0
    while len(recorder):
        report = tables_pb2.Report(window_seconds=1.0)
        recorder.fill(report)
        sent += len(tables_pb2.WatchRequest(report=report).SerializeToString())
    report_cpu = time.process_time() - start
    n = len(requests)
    total = (hook + report_cpu) / n
    return {
        "rate": rate, "requests": n, "recorded": recorded,
        "hook_us_per_request": round(hook / n * 1e6, 3),
        "report_us_per_request": round(report_cpu / n * 1e6, 3),
        "total_us_per_request": round(total * 1e6, 3),
        "us_per_recorded_row": round((hook + report_cpu) / recorded * 1e6, 3) if recorded else None,
        "cpu_ms_per_1000_requests": round(total * 1000 * 1e3, 3),
        "wire_bytes_per_row": round(sent / recorded, 1) if recorded else None,
        "share_of_proxy_unary": round(total / PROXY_UNARY_SECONDS, 5),
        "share_of_proxy_streamed": round(total / PROXY_STREAM_SECONDS, 5),
    }


def blocks(path: str, limit: int) -> dict[str, Any]:
    """The extra CPU per request of hashing every block of its prompt (the first 16 exactly, the rest as
    sketches, as a recorded request's are) rather than the first 16 alone, over the first ``limit`` prompts of
    the trace at ``path``; and, for scale, every block hashed exactly."""
    rows = tracefile.load(path, limit=limit)
    words = [tokenize(prompt_from_blocks(list(r.hash_ids), r.input_tokens)) for r in rows]

    def cpu(fn: Any) -> float:
        start = time.process_time()
        for w in words:
            fn(w)
        return time.process_time() - start
    lead = cpu(lambda w: chain_hashes(w, BLOCK_TOKENS, 16))
    sketched = cpu(lambda w: (lambda h: h + sketch_hashes(w, 16, 4096, h[-1]) if len(h) == 16 else h)(
        chain_hashes(w, BLOCK_TOKENS, 16)))
    exact = cpu(lambda w: chain_hashes(w, BLOCK_TOKENS, 4096))
    n = len(words)
    return {"trace": path, "requests": n, "mean_blocks": round(sum(-(-len(w) // 512) for w in words) / n, 1),
            "leading_16_us_per_request": round(lead / n * 1e6, 2),
            "sketched_us_per_request": round(sketched / n * 1e6, 2),
            "extra_us_per_request": round(max(sketched - lead, 0.0) / n * 1e6, 2),
            "all_exact_extra_us_per_request": round(max(exact - lead, 0.0) / n * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_recorder", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--hashes", type=int, default=8, help="block hashes per request (default 8: a 4k-token prompt)")
    p.add_argument("--rates", default="1.0,0.1,0.0")
    p.add_argument("--trace", default=str(BUNDLED), help="prompt lengths for the blocks' cost (the bundled excerpt)")
    p.add_argument("--prompts", type=int, default=200, help="prompts of --trace hashed (default 200)")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "recorder.json"))
    args = p.parse_args(argv)
    requests = states(args.requests, args.hashes)
    runs = [measure(requests, float(rate)) for rate in args.rates.split(",")]
    for r in runs:
        per_row = f"{r['us_per_recorded_row']:.2f} µs a recorded row" if r["recorded"] else "nothing recorded"
        print(f"rate {r['rate']:g}: {r['recorded']} of {r['requests']} recorded; hook {r['hook_us_per_request']:.2f} "
              f"+ report {r['report_us_per_request']:.2f} µs CPU a request ({per_row}; "
              f"{r['cpu_ms_per_1000_requests']:.2f} ms per 1,000 requests); "
              f"{100 * r['share_of_proxy_unary']:.2f} % of the proxy's ~1 ms a unary request, "
              f"{100 * r['share_of_proxy_streamed']:.3f} % of its ~6.5 ms a streamed one"
              + (f"; {r['wire_bytes_per_row']:.0f} bytes a row on the wire" if r["recorded"] else ""))
    hashed = blocks(args.trace, args.prompts)
    print(f"blocks: {hashed['requests']} prompts of {hashed['trace']} (mean {hashed['mean_blocks']} blocks): "
          f"the first 16 hashed in {hashed['leading_16_us_per_request']:.1f} µs; every block (the rest as "
          f"sketches) in {hashed['sketched_us_per_request']:.1f} µs: {hashed['extra_us_per_request']:.1f} µs more "
          f"a recorded request ({hashed['all_exact_extra_us_per_request']:.1f} µs more were every block hashed "
          "exactly)")
    full = next((r for r in runs if r["rate"] == 1.0), None)
    verdict = None
    if full is not None:
        whole = (full["total_us_per_request"] + hashed["extra_us_per_request"]) * 1e-6
        full["with_blocks_us_per_request"] = round(whole * 1e6, 2)
        full["with_blocks_share_of_proxy_streamed"] = round(whole / PROXY_STREAM_SECONDS, 5)
        verdict = full["share_of_proxy_unary"] < BUDGET
        print(f"record_rate 1.0 {'stays under' if verdict else 'exceeds'} {BUDGET:.0%} of the proxy's CPU per "
              "unary request" + ("" if verdict else ": lower the default rate")
              + f"; with every block of these prompts hashed, {whole * 1e6:.1f} µs a request, "
              f"{100 * whole / PROXY_STREAM_SECONDS:.2f} % of a streamed request's ~6.5 ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "recorder", "python": platform.python_version(), "hashes": args.hashes,
                               "proxy_unary_ms": PROXY_UNARY_SECONDS * 1e3,
                               "proxy_streamed_ms": PROXY_STREAM_SECONDS * 1e3, "budget_share": BUDGET,
                               "rate_1_within_budget": verdict, "runs": runs, "blocks": hashed}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
