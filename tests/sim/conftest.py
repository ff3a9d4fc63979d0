"""Small synthetic traces in both formats, written to a temporary folder."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pytest


def mooncake_rows(n: int = 240, seed: int = 5) -> list[dict[str, object]]:
    """Conversations that grow turn by turn under a shared first block, 2 requests per second."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    convs: list[list[int]] = []
    next_id = 1
    for i in range(n):
        if convs and rng.random() < 0.6:
            c = rng.randrange(len(convs))
            ids = convs[c] + list(range(next_id, next_id + rng.randint(1, 4)))
            convs[c] = ids
        else:
            ids = [0, *range(next_id, next_id + rng.randint(1, 6))]
            convs.append(ids)
        next_id += 10
        rows.append({"timestamp": i * 500, "input_length": len(ids) * 512 - rng.randint(0, 300),
                     "output_length": rng.randint(8, 40), "hash_ids": ids})
    return rows


@pytest.fixture
def mooncake_trace(tmp_path: Path) -> Path:
    path = tmp_path / "mini_mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in mooncake_rows()))
    return path


@pytest.fixture
def azure_trace(tmp_path: Path) -> Path:
    rng = random.Random(6)
    start = dt.datetime(2023, 11, 16, 18, 0, 0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(300):
        stamp = start + dt.timedelta(seconds=i * 0.3)
        lines.append(f"{stamp:%Y-%m-%d %H:%M:%S}.{stamp.microsecond:06d}0,{rng.randint(50, 3000)},"
                     f"{rng.randint(5, 40)}")
    path = tmp_path / "mini_azure.csv"
    path.write_text("\n".join(lines))
    return path
