"""A small synthetic recording for the what-if tests: cache-heavy conversations on a fleet with small caches."""

from __future__ import annotations

import random
from typing import Any

FLEET: dict[str, Any] = {"engines": [
    {"model": "chat", "kind": "sim", "replicas": ["r0", "r1", "r2", "r3"], "samples": 600,
     "params": {"max_running": 16, "prefix_cache_blocks": 1024}, "stderr": {}, "fit": {}},
]}


def conversations(n: int = 600, *, rate: float = 8.0, convs: int = 200, seed: int = 3,
                  models: tuple[str, ...] = ("chat",), proxies: int = 2) -> list[dict[str, Any]]:
    """``n`` recorded rows at ``rate`` per second: turns of ``convs`` conversations that grow by 1 to 3 blocks
    a turn under a shared first block (restarting past 40 blocks), with every recorded key a proxy writes."""
    rng = random.Random(seed)
    turns: dict[int, list[int]] = {}
    fresh = 1
    rows = []
    for i in range(n):
        c = rng.randrange(convs)
        ids = turns.get(c)
        ids = [0, *range(fresh, fresh + rng.randint(4, 12))] if ids is None or len(ids) > 40 else \
            [*ids, *range(fresh, fresh + rng.randint(1, 3))]
        fresh += 100
        turns[c] = ids
        prompt = len(ids) * 512 - rng.randint(0, 200)
        rows.append({"timestamp": round(i * 1000 / rate), "input_length": prompt,
                     "output_length": rng.randint(10, 60), "hash_ids": ids, "model": models[c % len(models)],
                     "tier": "interactive", "tenant": f"t{c % 3}", "max_tokens": 256, "cached_tokens": prompt // 2,
                     "ttft_ms": 50.0 + i % 7, "e2e_ms": 500.0 + i % 11, "replica": f"r{c % 4}", "branch": "affinity",
                     "outcome": "OK", "streamed": True, "proxy": f"p{i % proxies}", "region": "local",
                     "arrival": 1.7e9 + i / rate})
    return rows
