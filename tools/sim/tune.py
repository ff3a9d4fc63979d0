"""Tune: search the decision's parameters on the earlier part of recorded traffic, check the choice on the later.

:func:`tune` splits the rows by time (:func:`split_rows`: the first
``split`` of the span, default half, rounded up to a whole window, to fit
on; the rest held out), then runs a seeded **coordinate search** on the fit
part alone (simulated from a cold start at its first request):
from the baseline, one parameter at a time (in a seeded random order), every
value of its list in ``space`` is simulated (:func:`tools.sim.whatif.simulate`,
same seed for all) and the best kept if it beats the current choice by more
than ``min_gain`` (1 %); passes repeat until one changes nothing or
``budget`` simulator runs (the baseline's included; a setting already
simulated is not run again) are spent.

The objective (lower is better; :class:`Objective`): ``metric`` (TTFT p99 of
the answered requests by default; or ``ttft_p50_ms``, ``e2e_p99_ms``) times
``1 + refusal_penalty x refused share`` (penalty 10: 1 % of requests refused
costs as much as a 10 % longer tail), so a setting cannot shorten its tail
by refusing the slow requests.

The choice is then judged on the held-out part only (the fit part chose it,
so its gain there is biased up): the baseline and the choice are each
simulated over every row, so the held-out part starts warm (caches, learned
thresholds, outlier state as the earlier traffic left them), and only the
held-out requests and windows are counted; the objective's ratio (choice / baseline) gets a paired bootstrap
interval over time windows (:func:`tools.sim.whatif.pair`). The gain is
``1 - ratio``. The choice is proposed only when the whole interval of the
gain is above zero; else the answer is "no change is significantly better"
and nothing is proposed. The proposal names only the keys it changes
(:func:`proposal_toml`, a ``[proxy]`` fragment).

:data:`DEFAULT_SPACE` holds the decision's parameters
(:class:`dataplane.pick.settings.PickSettings`, the ring's load factor of
:class:`dataplane.table.settings.TableSettings`, the admission's capacity share of
:class:`dataplane.admission.settings.QueueSettings`, outlier ejection's latency factor of
:class:`dataplane.pick.settings.OutlierSettings`), a few values each around the
defaults. Cost: at most ``budget`` runs on the fit part and 2 on the
held-out part, each about 1 ms of wall time per request
(:mod:`tools.sim.whatif`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tomli_w

from dataplane.config import ProxySettings
from ferry.errors import ConfigError
from tools.sim import whatif
from tools.sim.whatif import FleetSpec, Row

DEFAULT_SPACE: dict[str, tuple[Any, ...]] = {
    "detour_factor": (6.0, 12.0, 24.0, 48.0, 96.0),
    "place_factor": (0.0, 1.5, 3.0, 6.0),
    "walk_limit": (2, 4, 8, 16),
    "load_factor": (1.1, 1.25, 1.5, 2.0),
    "admission_capacity_share": (0.8, 0.9, 1.0),
    "outlier_latency_factor": (3.0, 5.0, 10.0),
}
OBJECTIVE_METRICS = ("ttft_p99_ms", "ttft_p50_ms", "e2e_p99_ms")
MAX_BUDGET = 1000
MAX_VALUES = 64  # values per parameter in a search space


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """What the search minimises: ``metric x (1 + refusal_penalty x refused share)``."""

    metric: str = "ttft_p99_ms"
    refusal_penalty: float = 10.0

    def __post_init__(self) -> None:
        if self.metric not in OBJECTIVE_METRICS:
            raise ConfigError("objective", f"unknown metric {self.metric!r} (known: {', '.join(OBJECTIVE_METRICS)})")
        if not self.refusal_penalty >= 0:
            raise ConfigError("refusal_penalty", "must be >= 0")

    def describe(self) -> str:
        """The objective in words."""
        return f"{self.metric} x (1 + {self.refusal_penalty:g} x refused share), lower is better"

    def value(self, figures: Mapping[str, Any]) -> Any:
        """The objective of figures (floats, or arrays of bootstrap draws); inf where the metric has no value."""
        metric = np.asarray(figures[self.metric], dtype=float)
        value = metric * (1 + self.refusal_penalty * np.asarray(figures["refused_share"], dtype=float))
        return np.where(np.isfinite(value), value, np.inf)


def parse_space(items: Sequence[str], baseline: ProxySettings | None = None) -> dict[str, tuple[Any, ...]]:
    """``KEY=V1,V2,…`` items (values as TOML values: ``1.5``, ``8``, ``true``) as a search space; each value is
    checked as the config file's are (ConfigError naming ``proxy.<key>``)."""
    space: dict[str, tuple[Any, ...]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ConfigError("space", f"expected KEY=V1,V2,..., got {item!r}")
        try:
            values = tuple(tomllib.loads(f"v = [{text}]")["v"])
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"proxy.{key}", f"values {text!r} are not TOML values: {exc}") from exc
        space[key] = values
    return check_space(space, baseline or ProxySettings())


def check_space(space: Mapping[str, Sequence[Any]], baseline: ProxySettings) -> dict[str, tuple[Any, ...]]:
    """The space, every value of every key tried on ``baseline`` (ConfigError naming ``proxy.<key>``)."""
    out: dict[str, tuple[Any, ...]] = {}
    for key, values in space.items():
        if not values or len(values) > MAX_VALUES:
            raise ConfigError(f"proxy.{key}", f"give 1 to {MAX_VALUES} values to try")
        for value in values:
            whatif.with_changes(baseline, {key: value})
        out[key] = tuple(dict.fromkeys(values))
    return out


def split_rows(rows: Sequence[Row], split: float, window: float | None = None) -> tuple[int, float, float]:
    """Where to cut: (index of the first held-out row, the cut in seconds, the held-out part's window). The cut
    is the first ``split`` of the span rounded up to a whole window of the held-out part (``window``, else
    :func:`tools.sim.whatif.auto_window` of what follows the cut), so the held-out windows are those of a run
    over every row."""
    if not 0 < split < 1:
        raise ConfigError("split", "must be between 0 and 1")
    span = rows[-1].offset
    width = window or whatif.auto_window(span * (1 - split))
    cut = math.ceil(span * split / width) * width
    first = next((i for i, r in enumerate(rows) if r.offset >= cut), len(rows))
    if first == 0 or first == len(rows):
        raise ConfigError("split", f"{split:g} leaves no request in the {'fit' if first == 0 else 'held-out'} part")
    return first, cut, width


def _key(changes: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(changes.items()))


def _significant_gain(ratio_low: float | None, ratio_high: float | None) -> bool:
    return ratio_low is not None and ratio_high is not None and ratio_high < 1.0


def tune(rows: Sequence[Row], fleet: FleetSpec, baseline: ProxySettings,
         space: Mapping[str, Sequence[Any]] | None = None, *, budget: int = 24, split: float = 0.5, seed: int = 1,
         objective: Objective | None = None, window: float | None = None, resamples: int = 1000,
         level: float = 0.95, min_gain: float = 0.01) -> dict[str, Any]:
    """Search ``space`` on the fit part, judge the choice on the held-out part (see the module docstring)."""
    goal = objective or Objective()
    searched = check_space(DEFAULT_SPACE if space is None else space, baseline)
    if not 1 <= budget <= MAX_BUDGET:
        raise ConfigError("budget", f"must be 1..{MAX_BUDGET} simulator runs")
    if not 0 <= min_gain < 1:
        raise ConfigError("min_gain", "must be in [0, 1)")
    if not rows:
        raise ConfigError("traffic", "no requests")
    first, cut, held_window = split_rows(rows, split, window)
    fit = list(rows[:first])
    held = [dataclasses.replace(r, offset=r.offset - cut) for r in rows[first:]]
    fit_window = window or whatif.auto_window(fit[-1].offset)
    _, fit_count = whatif.window_index(fit, fit_window)
    tried: dict[tuple[tuple[str, Any], ...], float] = {}
    trials: list[dict[str, Any]] = []

    def evaluate(changes: dict[str, Any]) -> float:
        key = _key(changes)
        if key not in tried:
            settings = whatif.with_changes(baseline, changes)
            outcome = whatif.simulate(fit, fleet, settings, window=fit_window, windows=fit_count, seed=seed)
            figures = whatif.summary(fit, outcome, fit_window)
            tried[key] = float(goal.value(figures))
            trials.append({"changes": whatif._jsonable(changes), "objective": whatif._num(tried[key], 3),
                           **{m: whatif._num(figures[m]) for m in (*OBJECTIVE_METRICS, "refused_share")}})
        return tried[key]

    base_flat = whatif.flat(baseline)
    current: dict[str, Any] = {}
    best = baseline_objective = evaluate(current)
    order = list(searched)
    random.Random(seed).shuffle(order)
    improved = True
    while improved and len(tried) < budget:
        improved = False
        for key in order:
            now = current.get(key, base_flat.get(key))
            scored = []
            for value in searched[key]:
                if value == now:
                    continue
                changes = {k: v for k, v in {**current, key: value}.items() if base_flat.get(k) != v}
                if _key(changes) not in tried and len(tried) >= budget:
                    break
                scored.append((evaluate(changes), changes))
            if scored:
                score, changes = min(scored, key=lambda s: s[0])
                if score < best * (1 - min_gain):
                    best, current, improved = score, changes, True
    result: dict[str, Any] = {
        "objective": {"metric": goal.metric, "refusal_penalty": goal.refusal_penalty, "form": goal.describe()},
        "split": split, "seed": seed, "budget": budget, "runs": len(tried), "min_gain": min_gain,
        "space": {k: list(v) for k, v in searched.items()},
        "fit": {"requests": len(fit), "span_s": round(fit[-1].offset, 3), "window_s": fit_window,
                "baseline_objective": whatif._num(baseline_objective, 3), "best_objective": whatif._num(best, 3),
                "best_changes": whatif._jsonable(current)},
        "held_out": {"requests": len(held), "span_s": round(held[-1].offset, 3)},
        "trials": trials,
        "proposal": None,
    }
    if not current:
        result["verdict"] = ("no change is significantly better: nothing in the space beat the baseline by "
                             f"{min_gain:.0%} on the fit part")
        return result
    choice = whatif.with_changes(baseline, current)
    _, held_count = whatif.window_index(held, held_window)
    skip = round(cut / held_window)
    runs = tuple(whatif.simulate(rows, fleet, s, window=held_window, windows=skip + held_count, seed=seed)
                 .part(first, skip, held_count) for s in (baseline, choice))
    paired = whatif.pair(held, runs[0], runs[1], window=held_window, resamples=resamples, seed=seed)
    point = [float(goal.value(f)) for f in paired.point]
    ratio = point[1] / point[0] if point[0] > 0 and math.isfinite(point[0]) else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = goal.value(paired.boot[1]) / goal.value(paired.boot[0])
    low, high = whatif.interval(np.where(np.isfinite(draws), draws, np.nan), level)
    result["held_out"].update({
        "window_s": held_window, "windows": held_count,
        "baseline_objective": whatif._num(point[0], 3), "candidate_objective": whatif._num(point[1], 3),
        "ratio": whatif._num(ratio), "ratio_low": low, "ratio_high": high,
        "gain": whatif._num(1 - ratio), "gain_low": None if high is None else whatif._num(1 - high),
        "gain_high": None if low is None else whatif._num(1 - low),
        "comparison": whatif.report(held, fleet, baseline, choice, (runs[0], runs[1]), window=held_window,
                                    seed=seed, resamples=resamples, level=level),
    })
    if _significant_gain(low, high):
        result["proposal"] = whatif._jsonable(current)
        result["verdict"] = (f"proposed: {goal.metric} objective {1 - ratio:.1%} lower on the held-out part "
                             f"({level:.0%} interval of the gain {1 - high:.1%} to {1 - low:.1%})"
                             if low is not None and high is not None else "proposed")
    else:
        result["verdict"] = ("no change is significantly better: the best on the fit part gains "
                             f"{_pct(result['held_out']['gain'])} on the held-out part, "
                             f"its {level:.0%} interval includes zero")
    return result


def proposal_toml(changes: Mapping[str, Any], note: str = "") -> str:
    """A ``[proxy]`` fragment with only ``changes`` (a comment line first when ``note`` is given)."""
    body = tomli_w.dumps({"proxy": dict(changes)})
    return (f"# {note}\n" if note else "") + body


def render(result: Mapping[str, Any]) -> str:
    """The tune result in words: the search, its best choice, the held-out check and the verdict."""
    fit, held = result["fit"], result["held_out"]
    lines = [f"tune: objective {result['objective']['form']}",
             f"fit on the first {result['split']:.0%}: {fit['requests']} requests over {fit['span_s']:.0f} s; "
             f"{result['runs']} simulator runs of {result['budget']}; baseline {fit['baseline_objective']}, best "
             f"{fit['best_objective']} with " + (", ".join(f"{k} = {v}" for k, v in fit["best_changes"].items())
                                                  or "no change"),
             f"held out: {held['requests']} requests over {held['span_s']:.0f} s"]
    if "ratio" in held:
        lines[-1] += (f"; objective baseline {held['baseline_objective']}, choice {held['candidate_objective']}, "
                      f"gain {_pct(held['gain'])} [{_pct(held['gain_low'])}, {_pct(held['gain_high'])}]")
        lines += ["", whatif.render(held["comparison"]), ""]
    lines.append(result["verdict"])
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"
