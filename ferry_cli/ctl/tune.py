"""``ferryctl tune``: search the decision's ``[proxy]`` parameters on recorded traffic, check on held-out traffic.

``ferryctl tune --traffic FILE [--engines FILE | --replicas N] [--baseline FILE] [--budget N] [--split 0.5]
[--space KEY=V1,V2 ...] [--objective M] [--refusal-penalty P] [-o proposal.toml] [--json]``. Chooses on
the first ``--split`` of the recording, reports the choice's gain on the
rest with its bootstrap interval, and proposes it (``-o``: a TOML
``[proxy]`` fragment with only the changed keys) only when that interval is
wholly above zero; else it says "no change is significantly better" and
writes nothing. Method: :mod:`tools.sim.tune`. Runs locally, without a
control plane; inputs as ``what-if``'s (:func:`ferry_cli.ctl.whatif.inputs`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ferry.errors import ConfigError
from ferry_cli.ctl import whatif as ctlwhatif
from ferry_cli.ctl.errors import UsageError

HELP = "search the decision's [proxy] parameters in the fleet simulator on recorded traffic; propose a change"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tune`` command's flags."""
    ctlwhatif.add_inputs(parser)
    parser.add_argument("--budget", type=int, default=24, help="simulator runs on the fit part (default 24)")
    parser.add_argument("--split", type=float, default=0.5,
                        help="share of the span to fit on; the rest is held out (default 0.5)")
    parser.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2",
                        help="a [proxy] key and the values to try (repeatable; replaces the default space)")
    parser.add_argument("--objective", default="ttft_p99_ms", choices=("ttft_p99_ms", "ttft_p50_ms", "e2e_p99_ms"),
                        help="what to lower, times 1 + penalty x refused share (default ttft_p99_ms)")
    parser.add_argument("--refusal-penalty", type=float, default=10.0,
                        help="the refused share's weight in the objective (default 10)")
    parser.add_argument("-o", "--out", metavar="FILE", help="write the proposal, a [proxy] fragment, here")


def run(args: argparse.Namespace) -> int:
    """Tune, print the search and its verdict, write the proposal when there is one."""
    from tools.sim import tune

    try:
        baseline = ctlwhatif.baseline(args)
        space = tune.parse_space(args.space, baseline) if args.space else None
        rows, fleet = ctlwhatif.prepare(*ctlwhatif.inputs(args), args.replicas)
        result = tune.tune(rows, fleet, baseline, space, budget=args.budget, split=args.split, seed=args.seed,
                           objective=tune.Objective(metric=args.objective, refusal_penalty=args.refusal_penalty),
                           window=args.window, resamples=args.resamples)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    result["baseline_file"] = args.baseline
    if args.out and result["proposal"]:
        held = result["held_out"]
        note = (f"ferryctl tune: {result['objective']['form']}; held-out gain {held['gain']:.1%} "
                f"[{held['gain_low']:.1%}, {held['gain_high']:.1%}]")
        Path(args.out).write_text(tune.proposal_toml(result["proposal"], note), encoding="utf-8")
        result["written"] = args.out
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(tune.render(result))
        if args.out:
            print(f"wrote {args.out}" if result["proposal"] else f"nothing written to {args.out}")
    return 0
