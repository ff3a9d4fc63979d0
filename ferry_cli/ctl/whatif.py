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

With ``--traffic FILE`` it runs locally, without a control plane. With
``--since DURATION`` (``1h``, ``30m``) it asks the control plane (as every
other command, ``--control-plane`` or ``--ready-file``): the rows the
proxies recorded in that span (``ferryctl traffic export``'s), the engine
parameters fitted from the replicas' telemetry (``ferryctl engines``'s) as
the fleet, and, unless ``--baseline`` is given, the router config the
proxies run by default (``ferryctl router``'s default version; version 0,
each proxy's own file, is not known to the control plane: then today's
defaults, and the output says so). :func:`inputs` is the one place the
rows and the fleet come from; :func:`remote` fills it from the control
plane.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.errors import ConfigError
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.traffic import duration_arg

if TYPE_CHECKING:
    from dataplane.config import ProxySettings
    from tools.sim.whatif import FleetSpec, Row

HELP = "replay recorded traffic through the fleet simulator, a candidate [proxy] config against the baseline"


def add_inputs(parser: argparse.ArgumentParser) -> None:
    """The flags what-if and tune share: the traffic, the fleet, the baseline, the windows and the draws."""
    parser.add_argument("--since", type=duration_arg, default=None, metavar="DURATION",
                        help="recorded traffic of the last DURATION (90s, 30m, 1h) from the control plane, with its "
                             "fitted engines and live router config (instead of --traffic and --engines)")
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
    """The recorded rows (one dict per request) and the fitted engines (None: none given): from the control
    plane with ``--since`` (:func:`remote` put them on ``args.fetched``), else from ``--traffic`` and
    ``--engines``."""
    if getattr(args, "since", None) is not None:
        if args.traffic or args.engines:
            raise UsageError(f"{args.command}: --since asks the control plane; give it or --traffic/--engines")
        fetched: tuple[list[Mapping[str, Any]], Mapping[str, Any] | None] = args.fetched
        return fetched
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


def baseline(args: argparse.Namespace) -> ProxySettings:
    """The baseline: ``--baseline``'s file, else the router config the control plane gave (``--since``), else
    today's defaults."""
    if args.baseline:
        return settings(args.baseline, "--baseline")
    live: ProxySettings | None = getattr(args, "live_baseline", None)
    return live if live is not None else settings(None, "--baseline")


def remote(run_local: Any, stub: Any, args: argparse.Namespace, connect: Any, timeout: float) -> None:
    """Run ``what-if`` or ``tune`` (``run_local``) on the control plane's recording of the last ``--since``
    seconds: its rows, its fitted engines, and (without ``--baseline``) the proxies' default router config.
    Says on stderr what it fetched. UsageError when nothing was recorded."""
    from ferry.v1 import admin_pb2
    from ferry_cli.ctl import engines as ctlengines
    from ferry_cli.ctl import traffic as ctltraffic
    from ferry_cli.ctl.flow import leader
    from tools.sim import whatif

    lines, dropped, _ = ctltraffic.fetch(stub, connect, timeout, since=args.since)
    if not lines:
        raise UsageError(f"{args.command}: no traffic recorded in the last {args.since:g} s")
    with leader(stub, connect, timeout) as target:
        fits = target.GetEngines(admin_pb2.GetEnginesRequest(), timeout=timeout)
        router = target.GetRouter(admin_pb2.GetRouterRequest(), timeout=timeout)
        fleet = {"engines": [r for r in (ctlengines.row(v) for v in fits.engines)
                             if set(ctlengines.STEP_PARAMS) <= set(r["params"])]}
        said = (f"{args.command}: {len(lines)} rows recorded in the last {args.since:g} s ({dropped} dropped); "
                f"{len(fleet['engines'])} fitted engine kinds")
        if not args.baseline and router.default_version:
            version = router.default_version
            text = target.GetRouter(admin_pb2.GetRouterRequest(version=version), timeout=timeout).config.text
            try:
                args.live_baseline = whatif.settings_from_toml(text, f"router config v{version}")
            except ConfigError as exc:
                raise UsageError(str(exc)) from exc
            said += f"; baseline: router config v{version}, the proxies' default"
        elif not args.baseline:
            said += "; baseline: today's defaults (the proxies run their own files: no router config promoted)"
    print(said, file=sys.stderr)
    args.fetched = (lines, fleet if fleet["engines"] else None)
    run_local(args)


def run(args: argparse.Namespace) -> int:
    """Compare ``--config`` with the baseline on the recorded traffic; print the table or JSON; draw the plot."""
    from tools.sim import whatif

    if not args.config:
        raise UsageError("what-if: give --config FILE (the candidate's [proxy] section)")
    try:
        base, candidate = baseline(args), settings(args.config, "--config")
        rows, fleet = prepare(*inputs(args), args.replicas)
        result = whatif.compare(rows, fleet, base, candidate, window=args.window, seed=args.seed,
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
