"""A recorded row (``ferry.v1.TrafficRow``) as one JSON object and back: pure.

The JSON object has the message's field names; ``ttft_seconds`` is ``null``
when the row has none. :func:`from_json` rebuilds the message and refuses
(``ValueError``) an object whose fields are missing or of the wrong type, so a
damaged line of a segment is skipped, not exported. :func:`check` bounds a row
that arrives from the wire (names, hash count, finite times).
"""

from __future__ import annotations

import math
from typing import Any

from ferry.v1 import tables_pb2

STRINGS = ("model", "tier", "tenant", "replica_id", "branch", "outcome", "proxy_id", "region")
COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens", "max_tokens")
MAX_HASHES = 1024  # block hashes a row may carry (the proxy sends its prefix depth's, 16 by default)
MAX_NAME_BYTES = 256


def to_json(row: tables_pb2.TrafficRow) -> dict[str, Any]:
    """The JSON object of ``row`` (field names; ``ttft_seconds`` null when absent)."""
    return {
        "arrival": row.arrival, "model": row.model, "tier": row.tier, "tenant": row.tenant,
        "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens, "max_tokens": row.max_tokens, "hash_ids": list(row.hash_ids),
        "ttft_seconds": row.ttft_seconds if row.HasField("ttft_seconds") else None,
        "e2e_seconds": row.e2e_seconds, "replica_id": row.replica_id, "branch": row.branch,
        "outcome": row.outcome, "streamed": row.streamed, "proxy_id": row.proxy_id, "region": row.region,
    }


def from_json(data: Any) -> tables_pb2.TrafficRow:
    """The row of a JSON object :func:`to_json` made; ValueError naming the field at fault."""
    if not isinstance(data, dict):
        raise ValueError("row: not an object")
    for key in STRINGS:
        if not isinstance(data.get(key), str):
            raise ValueError(f"row.{key}: not a string")
    for key in COUNTS:
        value = data.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
            raise ValueError(f"row.{key}: not a count")
    for key in ("arrival", "e2e_seconds"):
        if not isinstance(data.get(key), int | float) or isinstance(data.get(key), bool):
            raise ValueError(f"row.{key}: not a number")
    hashes = data.get("hash_ids")
    if not isinstance(hashes, list) or not all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes):
        raise ValueError("row.hash_ids: not a list of 64-bit hashes")
    ttft = data.get("ttft_seconds")
    if ttft is not None and (not isinstance(ttft, int | float) or isinstance(ttft, bool)):
        raise ValueError("row.ttft_seconds: not a number")
    row = tables_pb2.TrafficRow(
        arrival=data["arrival"], e2e_seconds=data["e2e_seconds"], hash_ids=hashes, streamed=bool(data.get("streamed")),
        **{key: data[key] for key in STRINGS}, **{key: data[key] for key in COUNTS})
    if ttft is not None:
        row.ttft_seconds = ttft
    return row


def check(row: tables_pb2.TrafficRow) -> str | None:
    """Why a row from the wire is refused (a short reason, counted), or None."""
    if len(row.hash_ids) > MAX_HASHES:
        return "traffic_hashes"
    if any(len(getattr(row, key)) > MAX_NAME_BYTES for key in STRINGS):
        return "traffic_name"
    times = (row.arrival, row.e2e_seconds, row.ttft_seconds if row.HasField("ttft_seconds") else 0.0)
    if not all(math.isfinite(t) and t >= 0 for t in times):
        return "traffic_value"
    return None
