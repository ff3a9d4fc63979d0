"""``ferryctl engines [--model M] [--json]``: the fleet as the simulator sees it.

Per model and replica kind (engine/GPUs/version, from the replicas'
registrations), the engine model's four step parameters fitted by the
control plane from the replicas' step counters (``Admin.GetEngines``,
:mod:`controlplane.engines`), each with its standard error, the fit's
relative RMS error and R², the samples it rests on, and the static facts the
replicas report (KV blocks, block size, batch slots, step token budget). A
parameter the samples cannot tell is named with the reason instead of a
number; a kind whose replicas send no step counters shows "no samples".
Asked of the leader (it sees every node's samples;
:func:`ferry_cli.ctl.flow.leader`).

``--json`` prints ``{"engines": [row, ...]}``, each row (:func:`row`)::

    {"model": .., "kind": .., "engine": .., "gpus": .., "version": ..,
     "replicas": [ids], "sampled_replicas": n, "samples": n, "window_seconds": s,
     "params": {EngineParams field: value}, "stderr": {name: value | null},
     "unidentifiable": {name: reason}, "fit": {"relative_rms": .., "r2": ..}}

``params`` holds only known values, named exactly as
:class:`agent.replica.engine.EngineParams` names its fields, so
``EngineParams(**row["params"])`` works; :func:`fitted_params` does that over
a base (the what-if simulator builds its fleet with it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from agent.replica.engine import EngineParams
from ferry.v1 import admin_pb2
from ferry_cli.ctl.flow import Connect, leader
from ferry_cli.ctl.views import print_table

HELP = "per model and replica kind: the engine's step parameters fitted from telemetry, with their errors"
STEP_PARAMS = ("prefill_base_seconds", "prefill_seconds_per_token", "decode_base_seconds",
               "decode_seconds_per_request")
FACTS = ("kv_blocks_total", "kv_block_tokens", "max_running", "max_step_tokens", "prefix_cache_blocks")
_INT_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineParams) if f.type in ("int", int))


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def row(v: Any) -> dict[str, Any]:
    """One ``EngineFitView`` as a JSON row (see the module docstring)."""
    params: dict[str, Any] = {}
    stderr: dict[str, float | None] = {}
    unidentifiable: dict[str, str] = {}
    for p in v.params:
        if p.identifiable:
            params[p.name] = p.value
            stderr[p.name] = _number(p.stderr)
        else:
            unidentifiable[p.name] = p.reason
    for name in FACTS:
        value = getattr(v, name)
        if value or (name == "max_step_tokens" and v.unchunked):
            params[name] = int(value)
    return {
        "model": v.model, "kind": v.kind, "engine": v.engine, "gpus": v.gpus, "version": v.version,
        "replicas": list(v.replica_ids), "sampled_replicas": v.sampled_replicas, "samples": v.samples,
        "window_seconds": round(v.window_seconds, 1), "params": params, "stderr": stderr,
        "unidentifiable": unidentifiable,
        "fit": {"relative_rms": _number(v.relative_rms), "r2": _number(v.r2)},
    }


def fitted_params(row: Mapping[str, Any], base: EngineParams | None = None) -> EngineParams:
    """The engine parameters of a ``--json`` row: ``base`` (default: :class:`EngineParams`' defaults) with the
    row's fitted and reported values over it; raises ConfigError naming a value out of range."""
    given = row.get("params", {})
    fields = {f.name for f in dataclasses.fields(EngineParams)}
    values: dict[str, Any] = {k: (int(v) if k in _INT_FIELDS else float(v)) for k, v in given.items() if k in fields}
    return dataclasses.replace(base or EngineParams(), **values)


def _seconds(value: float) -> str:
    """A duration with a unit that keeps it readable (s, ms, µs)."""
    if value >= 1.0:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.3f} µs"


def table_rows(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The human table of one row: each step parameter, then the facts."""
    out: list[dict[str, Any]] = []
    for name in STEP_PARAMS:
        if name in r["params"]:
            se = r["stderr"].get(name)
            out.append({"parameter": name, "value": _seconds(r["params"][name]),
                        "stderr": "-" if se is None else _seconds(se),
                        "rel_stderr": "-" if se is None or not r["params"][name]
                        else f"{100 * se / r['params'][name]:.1f}%", "note": "fitted"})
        else:
            out.append({"parameter": name, "value": "-", "stderr": "-", "rel_stderr": "-",
                        "note": f"not identifiable: {r['unidentifiable'].get(name, 'no samples')}"})
    for name in FACTS:
        value = r["params"].get(name)
        shown = "no limit" if name == "max_step_tokens" and value == 0 else value
        out.append({"parameter": name, "value": "-" if value is None else shown, "stderr": "", "rel_stderr": "",
                    "note": "reported" if value is not None else "unknown"})
    return out


def _header(r: Mapping[str, Any]) -> str:
    fit = r["fit"]
    if not r["samples"]:
        error = "no samples"
    else:
        rms = "-" if fit["relative_rms"] is None else f"{100 * fit['relative_rms']:.2f}%"
        r2 = "-" if fit["r2"] is None else f"{fit['r2']:.4f}"
        error = f"{r['samples']} samples over {r['window_seconds']:g} s, relative RMS error {rms}, R² {r2}"
    return (f"{r['model']}  kind {r['kind']}  replicas {len(r['replicas'])} "
            f"({r['sampled_replicas']} sampled): {error}")


def cmd_engines(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    """Ask the leader for the fits and print them."""
    with leader(stub, connect, timeout) as target:
        reply = target.GetEngines(admin_pb2.GetEnginesRequest(model=args.model), timeout=timeout)
    rows = [row(v) for v in reply.engines]
    if args.json:
        print(json.dumps({"engines": rows, "leading": reply.leading, "samples_dropped": reply.samples_dropped},
                         indent=2))
        return
    if not rows:
        print("no replicas" + (f" of model {args.model}" if args.model else ""))
        return
    for i, r in enumerate(rows):
        if i:
            print()
        print(_header(r))
        print_table(table_rows(r), ["parameter", "value", "stderr", "rel_stderr", "note"])
    if not reply.leading:
        print("\n(a follower: only the nodes connected to it; ask the leader for the whole fleet)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ferryctl engines``'s arguments."""
    parser.add_argument("--model", default="", help="only this model")
