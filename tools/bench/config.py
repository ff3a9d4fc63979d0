"""What reading the config costs: the config modules' import time and the time to load a full config file.

Figures, each the median of ``--runs`` (7) fresh interpreters (``python -c``, the interpreter's own
start-up subtracted: the median of ``python -c pass``):

- ``import_ms``: importing :mod:`ferry.config` and :mod:`dataplane.config` (with what they import:
  pydantic for the first; the proxy's settings modules for the second), and the other planes' settings
  (:mod:`controlplane.config`, :mod:`agent.config`, :mod:`agent.replica.engine`);
- ``first_load_ms``: in a fresh interpreter with the modules imported, the first load of the full file
  (every section, every key set: ``ferry.config.load_file`` then each plane's section, the proxy's
  through ``dataplane.config.load``): what a process pays at start;
- ``load_us``: the same load repeated in one process (``--loads`` times, 200): the steady cost, as
  when a router config version is laid over the file's settings.

The full file is written from the declarations' defaults (every ``[proxy]`` key, every plane's section)
plus 100 tenants, 20 models and 4 guardrails. Writes ``bench-results/config.json``.

Usage: ``python -m tools.bench.config [--runs N] [--loads N] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

IMPORTS = {
    "ferry.config": "import ferry.config",
    "dataplane.config": "import dataplane.config",
    "all planes' settings": "import dataplane.config, controlplane.config, agent.config, agent.replica.engine, "
                            "controlplane.services.scaling, dataplane.envoy.bootstrap",
}

LOAD = """
import sys, time
from agent.config import AgentSettings
from agent.replica.engine import EngineParams
from controlplane.config import ControlPlaneSettings
from controlplane.services.scaling import ScalingSettings
from dataplane.config import load
from dataplane.envoy.bootstrap import EnvoySettings
from ferry.config import load_file

def once(path):
    file = load_file(path)
    for cls, name in ((ControlPlaneSettings, "controlplane"), (ScalingSettings, "scaling"),
                      (AgentSettings, "agent"), (EngineParams, "replica"), (EnvoySettings, "envoy")):
        file.section(cls, name)
    load(path)

began = time.perf_counter()
once(sys.argv[1])
first = time.perf_counter() - began
loads = int(sys.argv[2])
began = time.perf_counter()
for _ in range(loads):
    once(sys.argv[1])
print(first, (time.perf_counter() - began) / loads)
"""


def _plain(value: Any) -> Any:
    """A default as TOML writes it (tuples as arrays)."""
    return list(value) if isinstance(value, tuple) else value


def full_config() -> dict[str, Any]:
    """Every section of a config file with every key at its declared default (plus tenants, models, hooks)."""
    from agent.config import AgentSettings
    from agent.replica.engine import EngineParams
    from controlplane.config import ControlPlaneSettings
    from controlplane.services.scaling import ScalingSettings
    from dataplane.config import ProxySettings
    from dataplane.envoy.bootstrap import EnvoySettings
    from ferry.config import Limits, hash_api_key

    def section(obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            out[f.name] = section(value) if dataclasses.is_dataclass(value) else _plain(value)
        return out

    proxy: dict[str, Any] = {"proxy_id": "p-bench", "region": "local"}
    defaults = ProxySettings()
    for f in dataclasses.fields(defaults):
        part = getattr(defaults, f.name)
        if dataclasses.is_dataclass(part):
            proxy.update(section(part))
    controlplane = section(ControlPlaneSettings())
    controlplane["region_rtt_ms"] = {"a:b": 40.0, "a:c": 120.0}
    return {
        "tenants": [{"name": f"t{i}", "api_key_sha256": hash_api_key(f"k{i}"), "plan": "paid",
                     "requests_per_second": 50.0, "max_concurrency": 64} for i in range(100)],
        "models": [{"name": f"m{i}", "default_version": "v1", "min_gpus": 1} for i in range(20)],
        "guardrails": [{"name": f"g{i}", "address": f"127.0.0.1:{7000 + i}", "models": ["m0"]} for i in range(4)],
        "limits": section(Limits()),
        "proxy": proxy,
        "controlplane": controlplane,
        "scaling": section(ScalingSettings()),
        "agent": section(AgentSettings()),
        "replica": section(EngineParams()),
        "envoy": section(EnvoySettings()),
    }


def _run(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return out.stdout


def _wall(code: str) -> float:
    began = time.perf_counter()
    _run(code)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.bench.config", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--runs", type=int, default=7, help="fresh interpreters per figure")
    p.add_argument("--loads", type=int, default=200, help="loads repeated in one process")
    p.add_argument("--out", default="bench-results/config.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ferry.toml"
        path.write_text(tomli_w.dumps(full_config()), encoding="utf-8")
        keys = sum(len(v) if isinstance(v, dict) else 0 for v in full_config().values())
        bare = statistics.median(_wall("pass") for _ in range(args.runs))
        imports = {name: round((statistics.median(_wall(code) for _ in range(args.runs)) - bare) * 1000, 1)
                   for name, code in IMPORTS.items()}
        runs = [tuple(map(float, _run(LOAD, str(path), str(args.loads)).split())) for _ in range(args.runs)]
    first_ms = round(statistics.median(r[0] for r in runs) * 1000, 2)
    load_us = round(statistics.median(r[1] for r in runs) * 1e6, 1)
    report = {"python": sys.version.split()[0], "runs": args.runs, "loads": args.loads, "section_keys": keys,
              "interpreter_ms": round(bare * 1000, 1), "import_ms": imports, "first_load_ms": first_ms,
              "load_us": load_us}
    for name, ms in imports.items():
        print(f"import {name:<24} {ms:8.1f} ms")
    print(f"first load of the full file    {first_ms:8.2f} ms  ({keys} keys in the sections, 100 tenants)")
    print(f"each further load              {load_us / 1000:8.2f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
