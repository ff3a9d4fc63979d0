"""Tokenization cost per request at the proxy: whitespace words against a Hugging Face BPE tokenizer.

For each tokenizer (``whitespace``; ``bpe``: a byte-level BPE of
``--vocab`` tokens trained in-process on generated text, no download) and
each prompt size (a short prompt of about 64 tokens, 1k tokens, 8k tokens),
it times what the proxy does per request: count the tokens and hash the
leading 16 blocks of 512 (:meth:`ferry.tokens.Tokenizer.encode`), median of
``--repeat`` runs, in µs. With ``--threads`` it also times ``--threads``
8k prompts encoded at once in as many threads (does the library release the
GIL?), and the round trip of an empty job through a worker thread from the
event loop (what offloading adds). Prints one line per case and writes
``bench-results/tokens.json``.

Usage: ``python -m tools.bench.tokens [--repeat 200] [--vocab 8000] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import random
import statistics
import sys
import time
from pathlib import Path

from ferry.tokens import WHITESPACE, Tokenizer

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("the", "model", "routes", "each", "request", "to", "a", "replica", "whose", "cache", "holds", "its",
         "prefix", "while", "queues", "stay", "short", "and", "tenants", "share", "capacity", "fairly", "across",
         "regions", "tiers", "interactive", "standard", "batch", "tokens", "blocks", "hashing", "latency",
         "throughput", "decode", "prefill", "kernel", "memory", "scheduler", "gateway")


def corpus(rng: random.Random, words: int) -> str:
    """Generated text of ``words`` words, with punctuation and numbers, so BPE merges are not trivial."""
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        if rng.random() < 0.1:
            w = f"{w}{rng.randrange(1000)}"
        if i % 13 == 12:
            w += rng.choice(".,;:!?")
        out.append(w)
    return " ".join(out)


def bpe(vocab: int, rng: random.Random) -> Tokenizer:
    """A byte-level BPE tokenizer trained on generated text."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HfTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([corpus(rng, 200) for _ in range(500)], trainer=trainer)
    return Tokenizer("bpe", hf)


def prompt_of(tokenizer: Tokenizer, tokens: int, rng: random.Random) -> str:
    """A generated prompt of about ``tokens`` tokens of ``tokenizer``."""
    text = corpus(rng, tokens)
    while tokenizer.count(text) < tokens:
        text += " " + corpus(rng, max(8, tokens // 8))
    return text


def time_us(fn: object, repeat: int) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs, µs."""
    assert callable(fn)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


async def _hop_us(repeat: int) -> float:
    """Median µs of an empty job run in a worker thread and awaited from the event loop."""
    loop = asyncio.get_running_loop()
    times = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(repeat):
            t = time.perf_counter()
            await loop.run_in_executor(pool, int)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench-results" / "tokens.json"))
    args = p.parse_args(argv)
    rng = random.Random(7)
    rows = []
    for tokenizer in (WHITESPACE, bpe(args.vocab, rng)):
        for label, size in (("short", 64), ("1k", 1024), ("8k", 8192)):
            text = prompt_of(tokenizer, size, rng)
            count = tokenizer.count(text)
            us = time_us(lambda t=tokenizer, x=text: t.encode(x, blocks=16), args.repeat)
            rows.append({"tokenizer": tokenizer.kind, "prompt": label, "tokens": count, "bytes": len(text.encode()),
                         "us_per_request": round(us, 1)})
            print(f"{tokenizer.kind:10s} {label:5s} {count:6d} tokens {len(text.encode()):7d} bytes "
                  f"{us:9.1f} µs/request", flush=True)
        if args.threads > 1 and tokenizer.hf is not None:
            texts = [prompt_of(tokenizer, 8192, rng) for _ in range(args.threads)]
            with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
                def run(t: Tokenizer = tokenizer, xs: list[str] = texts) -> None:
                    list(pool.map(lambda x: t.encode(x, blocks=16), xs))
                us = time_us(run, max(10, args.repeat // 4))
            rows.append({"tokenizer": tokenizer.kind, "prompt": f"8k x{args.threads} threads",
                         "us_per_request": round(us / args.threads, 1), "wall_us": round(us, 1)})
            print(f"{tokenizer.kind:10s} 8k x{args.threads} in {args.threads} threads: {us:9.1f} µs wall, "
                  f"{us / args.threads:9.1f} µs/request", flush=True)
    hop = asyncio.run(_hop_us(args.repeat))
    rows.append({"tokenizer": "-", "prompt": "thread round trip", "us_per_request": round(hop, 1)})
    print(f"worker thread round trip from the event loop: {hop:9.1f} µs", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "tokens", "python": sys.version.split()[0], "repeat": args.repeat,
                               "vocab": args.vocab, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
