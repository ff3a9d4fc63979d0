"""``ferryctl what-if``: recorded traffic replayed through the fleet simulator under two ``[proxy]`` configs.

``ferryctl what-if --traffic FILE [--engines FILE | --replicas N] [--baseline FILE] --config FILE [--window S]
[--seed N] [--resamples N] [--plot FILE.png] [--json]``. The baseline is
today's defaults unless ``--baseline`` gives a TOML file; the candidate is
``--config``'s ``[proxy]`` section. Prints a side-by-side table (TTFT p50
and p99, end-to-end p99, prefix hit ratio, refused share, GPU utilisation),
each change with its paired bootstrap interval over time windows and a
verdict; ``--json`` prints the same as JSON, ``--plot`` draws it. The
method is :mod:`tools.sim.whatif`'s (imported when the command runs: the
simulator ships in the wheel under ``tools/sim``).

Runs locally, without a control plane. :func:`inputs` is the one place the
rows and the fitted engines come from (files today), so a source such as
the control plane's recorded traffic plugs in there.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.cli.ctl.errors import UsageError
from ferry.errors import ConfigError

if TYPE_CHECKING:
    from dataplane.config import ProxySettings
    from tools.sim.whatif import FleetSpec, Row

HELP = "replay recorded traffic through the fleet simulator, a candidate [proxy] config against the baseline"


def add_inputs(parser: argparse.ArgumentParser) -> None:
    """The flags what-if and tune share: the traffic, the fleet, the baseline, the windows and the draws."""
    parser.add_argument("--traffic", metavar="FILE", help="recorded requests, JSON Lines in the Mooncake layout "
                                                          "(timestamp ms, input_length, output_length, hash_ids; "
                                                          "model, tier, tenant, proxy, ttft_ms... when recorded)")
    parser.add_argument("--engines", metavar="FILE", help="the fitted fleet, JSON {\"engines\": [{model, replicas, "
                                                          "params}]} (default: --replicas default engines per model)")
    parser.add_argument("--replicas", type=int, default=None,
                        help="without --engines: replicas per model (default: the replicas the recording names, "
                             "else 8)")
    parser.add_argument("--baseline", metavar="FILE", help="TOML whose [proxy] section is the baseline "
                                                           "(default: today's defaults)")
    parser.add_argument("--window", type=float, default=None,
                        help="seconds per time window of the intervals (default: 10 to 30 windows over the span)")
    parser.add_argument("--seed", type=int, default=1, help="simulator and bootstrap seed (default 1)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``what-if`` command's flags."""
    add_inputs(parser)
    parser.add_argument("--config", metavar="FILE", help="TOML whose [proxy] section is the candidate (required)")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw per-window TTFT p99 and the intervals")


def inputs(args: argparse.Namespace) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """The recorded rows (one dict per request) and the fitted engines (None: none given), from
    ``--traffic`` and ``--engines``. The seam for other sources (e.g. a recorded span on the control plane)."""
    if not args.traffic:
        raise UsageError(f"{args.command}: give --traffic FILE (recorded requests, JSON Lines)")
    records: list[Mapping[str, Any]] = []
    try:
        with Path(args.traffic).open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise UsageError(f"--traffic {args.traffic}:{n}: not JSON: {exc}") from exc
        engines = json.loads(Path(args.engines).read_text(encoding="utf-8")) if args.engines else None
    except OSError as exc:
        raise UsageError(f"{exc.filename}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--engines {args.engines}: not JSON: {exc}") from exc
    return records, engines


def prepare(records: list[Mapping[str, Any]], engines: Mapping[str, Any] | None,
            replicas: int | None) -> tuple[list[Row], FleetSpec]:
    """Rows and fleet from what :func:`inputs` gave (ConfigError naming the field)."""
    from tools.sim import whatif

    rows = whatif.parse_rows(records)
    if engines is not None and replicas is not None:
        raise UsageError("give --engines or --replicas, not both")
    fleet = whatif.parse_fleet(engines) if engines is not None else whatif.default_fleet(rows, replicas)
    return rows, fleet


def settings(path: str | None, flag: str) -> ProxySettings:
    """The ``[proxy]`` section of the TOML file at ``path`` (None: the defaults)."""
    from dataplane.config import ProxySettings
    from tools.sim import whatif

    if path is None:
        return ProxySettings()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}") from exc
    return whatif.settings_from_toml(text, path)


def run(args: argparse.Namespace) -> int:
    """Compare ``--config`` with the baseline on the recorded traffic; print the table or JSON; draw the plot."""
    from tools.sim import whatif

    if not args.config:
        raise UsageError("what-if: give --config FILE (the candidate's [proxy] section)")
    try:
        baseline, candidate = settings(args.baseline, "--baseline"), settings(args.config, "--config")
        rows, fleet = prepare(*inputs(args), args.replicas)
        result = whatif.compare(rows, fleet, baseline, candidate, window=args.window, seed=args.seed,
                                resamples=args.resamples)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    result["baseline"]["file"], result["candidate"]["file"] = args.baseline, args.config
    if args.plot:
        try:
            whatif.plot(result, args.plot)
        except ImportError as exc:
            raise UsageError(f"--plot needs matplotlib ({exc})") from exc
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(whatif.render(result))
        if args.plot:
            print(f"wrote {args.plot}")
    return 0
