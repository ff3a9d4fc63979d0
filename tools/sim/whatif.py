"""What-if: replay recorded traffic through the fleet simulator under two proxy configs, and compare them.

Inputs (pure: the caller reads files or asks the control plane):

- **rows** (:func:`parse_rows`): recorded requests in the Mooncake layout
  (``timestamp`` ms from the start, ``input_length``, ``output_length``,
  ``hash_ids``) plus, when recorded, ``model``, ``tier``, ``tenant``,
  ``proxy``, ``replica``, ``cached_tokens``, ``ttft_ms``, ``e2e_ms``,
  ``outcome`` (and others, ignored). A plain Mooncake trace is one model,
  tier ``standard``, one tenant. Requests that share a timestamp are spread
  over the step to the next one (:func:`tools.trace.spread`).
- **fleet** (:func:`parse_fleet`): the fitted engines, ``{"engines": [{"model",
  "kind", "replicas": [ids], "params": {EngineParams fields}}]}``, or
  :func:`default_fleet` (N replicas of default :class:`EngineParams` per model).
- two :class:`dataplane.config.ProxySettings` (:func:`settings_from_toml`).

Method (:func:`compare`): each config is simulated once
(:func:`simulate`) on the same requests with the same seed: per model, that
model's requests on its replicas (:class:`tools.sim.fleet.Fleet`) behind
``proxies`` proxies running Ferry's decision with that config
(:class:`tools.sim.policies.Ferry`), the proxies as many as the recording
names (each request arrives at its recorded proxy), the ring and table
parameters from the config's ``[proxy]`` table keys. The figures, overall
and per window of ``window`` seconds of arrival time (:func:`auto_window`:
a 1-2-5 width giving 10 to 30 windows): TTFT p50 and p99 and end-to-end p99
of the answered requests (nearest rank), the prefix hit ratio (cached over
prompt tokens, all requests), the refused share (refused by the proxy or
the engine, or timed out in the proxy's queue) and the GPU utilisation
(engine-busy seconds over replica seconds).

Intervals: a paired bootstrap over windows. Each of ``resamples`` (1,000)
draws K window indices with replacement (K windows; numpy, seeded), pools
the requests of the drawn windows (a window drawn twice counts twice) and
recomputes every figure for both configs and their ratio (latencies:
candidate / baseline) or difference (shares: candidate - baseline); the
interval is the central ``level`` (95 %) of those. Resampling whole windows
keeps the dependence between requests close in time (queues, caches)
inside a draw. A change is called significant when its interval excludes
no change (1 for a ratio, 0 for a difference); the same config on both
sides gives a ratio of exactly 1.

Limits of the model: the simulated replicas are :class:`agent.replica.engine.Engine`
with the fitted parameters (no network, no proxy processing time); a
request generates its recorded ``output_length`` tokens; models run on
separate fleets and their proxies do not share admission; lower tiers are
not preempted. Cost: one simulator run per config, about 1 ms of wall time
per request (``wall_seconds`` in the result), plus
O(resamples x requests) for the intervals.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.replica.engine import EngineParams
from dataplane.config import ProxySettings
from ferry.config import TIERS, from_mapping
from ferry.errors import ConfigError
from tools.report import percentile
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import Ferry
from tools.sim.workload import TENANT, SimRequest
from tools.trace import spread

MAX_ROWS = 2_000_000  # recorded requests one what-if takes (about half an hour of simulator time per config)
MAX_REPLICAS = 4096   # replicas of one model
MAX_WINDOWS = 1000
DEFAULT_TIER = "standard"  # the tier of a row that records none
DEFAULT_REPLICAS = 8       # replicas per model without a fleet file nor recorded replica ids
DEFAULT_MODEL = "default"  # the model of rows that name none, in a fleet made for them (default_fleet)
ANSWERED = ("", "OK")      # recorded outcomes that are answers (else a refusal or an error)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One recorded request: what the simulator replays, and what was measured of it (None: not recorded)."""

    offset: float               # seconds after the first request
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    model: str = ""
    tier: str = DEFAULT_TIER
    tenant: str = TENANT
    proxy: str = ""
    replica: str = ""
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    outcome: str = ""


def _int(record: Mapping[str, Any], key: str, where: str, least: int) -> int:
    value = record.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"{where}.{key}", f"must be an integer >= {least}, got {value!r}")
    return value


def _optional_number(record: Mapping[str, Any], key: str, where: str) -> float | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ConfigError(f"{where}.{key}", f"must be a number >= 0 or null, got {value!r}")
    return float(value)


def _text(record: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = record.get(key)
    if value is None:
        return default
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ConfigError(f"{where}.{key}", f"must be a string, got {value!r}")
    return str(value)


def parse_rows(records: Iterable[Mapping[str, Any]], where: str = "traffic") -> list[Row]:
    """Recorded requests (dicts, see the module docstring) as :class:`Row` in arrival order; ConfigError naming
    ``<where>[i].<key>`` for a bad field, ``<where>`` when there is no request (or more than :data:`MAX_ROWS`)."""
    raw: list[tuple[float, dict[str, Any]]] = []
    for i, record in enumerate(records):
        at = f"{where}[{i}]"
        if not isinstance(record, Mapping):
            raise ConfigError(at, "must be a JSON object")
        if len(raw) >= MAX_ROWS:
            raise ConfigError(where, f"more than {MAX_ROWS} requests: record a shorter span")
        stamp = record.get("timestamp")
        if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not math.isfinite(stamp):
            raise ConfigError(f"{at}.timestamp", f"must be a number of milliseconds, got {stamp!r}")
        hashes = record.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise ConfigError(f"{at}.hash_ids", "must be a list of integers")
        tier = _text(record, "tier", at, DEFAULT_TIER)
        if tier not in TIERS:
            raise ConfigError(f"{at}.tier", f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
        cached = record.get("cached_tokens")
        raw.append((stamp / 1000.0, {
            "prompt_tokens": _int(record, "input_length", at, 0),
            "output_tokens": max(1, _int(record, "output_length", at, 0)),
            "hash_ids": tuple(hashes),
            "model": _text(record, "model", at, ""),
            "tier": tier,
            "tenant": _text(record, "tenant", at, TENANT) or TENANT,
            "proxy": _text(record, "proxy", at, ""),
            "replica": _text(record, "replica", at, ""),
            "cached_tokens": None if cached is None else _int(record, "cached_tokens", at, 0),
            "ttft_ms": _optional_number(record, "ttft_ms", at),
            "e2e_ms": _optional_number(record, "e2e_ms", at),
            "outcome": _text(record, "outcome", at, ""),
        }))
    if not raw:
        raise ConfigError(where, "no requests")
    raw.sort(key=lambda r: r[0])
    return [Row(offset=at, **fields) for at, (_, fields) in zip(spread([r[0] for r in raw]), raw, strict=True)]


def read_rows(path: str | Path) -> list[Row]:
    """The rows of a JSON Lines file (:func:`parse_rows`); a line that is not JSON is named by its number."""
    records = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}", f"not JSON: {exc}") from exc
    return parse_rows(records, where=str(path))


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """Replicas of one model with one set of fitted engine parameters."""

    model: str
    replicas: tuple[str, ...]
    params: EngineParams
    kind: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class FleetSpec:
    """The simulated fleet: groups of replicas per model."""

    groups: tuple[Group, ...]

    def models(self) -> list[str]:
        """The models, in order of first appearance."""
        return list(dict.fromkeys(g.model for g in self.groups))

    def replicas(self, model: str) -> list[tuple[str, EngineParams]]:
        """(replica id, engine parameters) of ``model``'s replicas."""
        return [(r, g.params) for g in self.groups if g.model == model for r in g.replicas]


def engine_params(params: Mapping[str, Any], where: str) -> EngineParams:
    """:class:`EngineParams` from fitted values (integral floats taken for integer fields); ConfigError naming
    ``<where>.<key>`` for an unknown key or a value out of range."""
    if not isinstance(params, Mapping):
        raise ConfigError(where, "must be an object of EngineParams fields")
    ints = {f.name for f in dataclasses.fields(EngineParams) if f.type in (int, "int")}
    values = {k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v for k, v in params.items()}
    try:
        return from_mapping(EngineParams, values, where)
    except ConfigError as exc:
        if exc.key.startswith("replica."):  # EngineParams' own range check names the [replica] section's key
            raise ConfigError(f"{where}.{exc.key.removeprefix('replica.')}", exc.reason) from exc
        raise


def parse_fleet(data: Mapping[str, Any], where: str = "engines") -> FleetSpec:
    """The fitted fleet (see the module docstring) as a :class:`FleetSpec`; ConfigError naming the field."""
    if not isinstance(data, Mapping) or not isinstance(data.get("engines"), list):
        raise ConfigError(where, "must be a list of engine groups")
    groups = []
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(data["engines"]):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(at, "must be an object")
        model = entry.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{at}.model", "must be a non-empty string")
        replicas = entry.get("replicas")
        if not isinstance(replicas, list) or not replicas or not all(isinstance(r, str) and r for r in replicas):
            raise ConfigError(f"{at}.replicas", "must be a non-empty list of replica ids")
        for r in replicas:
            if (model, r) in seen:
                raise ConfigError(f"{at}.replicas", f"replica {r!r} of {model} listed twice")
            seen.add((model, r))
        groups.append(Group(model=model, replicas=tuple(replicas), kind=str(entry.get("kind") or ""),
                            params=engine_params(entry.get("params", {}), f"{at}.params")))
    if not groups:
        raise ConfigError(where, "no engines")
    spec = FleetSpec(tuple(groups))
    for model in spec.models():
        if len(spec.replicas(model)) > MAX_REPLICAS:
            raise ConfigError(where, f"{model}: more than {MAX_REPLICAS} replicas")
    return spec


def default_fleet(rows: Sequence[Row], replicas: int | None = None,
                  params: EngineParams | None = None) -> FleetSpec:
    """Default engines for every model of ``rows``: ``replicas`` each, else as many as the rows name for that
    model (their ``replica``), else :data:`DEFAULT_REPLICAS`."""
    if replicas is not None and not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError("replicas", f"must be 1..{MAX_REPLICAS}")
    groups = []
    for model in dict.fromkeys(r.model for r in rows):
        named = sorted({r.replica for r in rows if r.model == model and r.replica})
        n = replicas or min(MAX_REPLICAS, len(named)) or DEFAULT_REPLICAS
        ids = named if not replicas and named else [f"r{i:03d}" for i in range(n)]
        groups.append(Group(model=model or DEFAULT_MODEL, replicas=tuple(ids[:n]), params=params or EngineParams()))
    return FleetSpec(tuple(groups))


def settings_from_toml(text: str, where: str) -> ProxySettings:
    """The ``[proxy]`` section of a TOML config as :class:`ProxySettings` (ConfigError naming ``proxy.<key>``)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, f"not valid TOML: {exc}") from exc
    if "proxy" not in data:
        raise ConfigError("proxy", f"{where} has no [proxy] section")
    return ProxySettings.from_section(data["proxy"])


def flat(settings: ProxySettings) -> dict[str, Any]:
    """Every ``[proxy]`` key of ``settings`` and its value (what :meth:`ProxySettings.from_section` takes)."""
    out: dict[str, Any] = {"proxy_id": settings.proxy_id, "region": settings.region}
    for f in dataclasses.fields(settings):
        part = getattr(settings, f.name)
        if dataclasses.is_dataclass(part):
            out.update((g.name, getattr(part, g.name)) for g in dataclasses.fields(part))
    return out


def changed(settings: ProxySettings, against: ProxySettings | None = None) -> dict[str, Any]:
    """The ``[proxy]`` keys whose value in ``settings`` differs from ``against`` (default: the defaults)."""
    base = flat(against or ProxySettings())
    return {k: v for k, v in flat(settings).items() if base.get(k) != v}


def with_changes(settings: ProxySettings, changes: Mapping[str, Any]) -> ProxySettings:
    """``settings`` with some ``[proxy]`` keys changed (checked as the file's are: ConfigError naming the key)."""
    return ProxySettings.from_section({**flat(settings), **changes})


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One config's simulated run over all the rows (arrays in row order; times in seconds, NaN: not answered)."""

    ttft: np.ndarray
    e2e: np.ndarray
    cached: np.ndarray
    refused: np.ndarray
    busy: np.ndarray      # engine-busy seconds over all replicas per window
    replicas: int
    proxies: int
    wall_seconds: float

    def part(self, first_row: int, first_window: int, windows: int) -> Outcome:
        """The rows from ``first_row`` on and ``windows`` windows from ``first_window`` on (a held-out tail)."""
        return dataclasses.replace(self, ttft=self.ttft[first_row:], e2e=self.e2e[first_row:],
                                   cached=self.cached[first_row:], refused=self.refused[first_row:],
                                   busy=self.busy[first_window:first_window + windows])


def proxies_of(rows: Sequence[Row]) -> tuple[int, list[int]]:
    """The number of proxies (distinct recorded ``proxy``, at least 1) and each row's index among them (-1:
    not recorded, drawn at random)."""
    names = sorted({r.proxy for r in rows if r.proxy})
    index = {name: i for i, name in enumerate(names)}
    return max(1, len(names)), [index.get(r.proxy, -1) for r in rows]


def _model_of(rows: Sequence[Row], fleet: FleetSpec) -> list[str]:
    """Each row's model in the fleet; a row that names none takes the fleet's only model."""
    models = fleet.models()
    out = []
    for i, r in enumerate(rows):
        model = r.model or (models[0] if len(models) == 1 else DEFAULT_MODEL)
        if model not in models:
            what = f"model {r.model!r}" if r.model else "no model named (and the fleet has several)"
            raise ConfigError(f"traffic[{i}].model", f"{what}: not in the fleet (models: {', '.join(models)})")
        out.append(model)
    return out


def simulate(rows: Sequence[Row], fleet: FleetSpec, settings: ProxySettings, *, window: float, windows: int,
             seed: int = 1, refresh_seconds: float = 0.5, telemetry_seconds: float = 0.5) -> Outcome:
    """One run of ``settings`` over ``rows``: per model, its rows on its replicas (see the module docstring)."""
    started = time.monotonic()
    n = len(rows)
    ttft, e2e = np.full(n, np.nan), np.full(n, np.nan)
    cached: np.ndarray = np.zeros(n, dtype=np.int64)
    refused: np.ndarray = np.zeros(n, dtype=bool)
    busy = np.zeros(windows)
    proxies, proxy_index = proxies_of(rows)
    models = _model_of(rows, fleet)
    replicas = 0
    for model in fleet.models():
        picked = [i for i, m in enumerate(models) if m == model]
        if not picked:
            continue
        engines = fleet.replicas(model)
        replicas += len(engines)
        requests = [SimRequest(k, rows[i].offset, rows[i].prompt_tokens, rows[i].output_tokens, rows[i].hash_ids,
                               tenant=rows[i].tenant, tier=rows[i].tier, proxy=proxy_index[i])
                    for k, i in enumerate(picked)]
        config = FleetConfig(replicas=len(engines), proxies=proxies, refresh_seconds=refresh_seconds,
                             telemetry_seconds=telemetry_seconds, engine=engines[0][1],
                             engines={k: p for k, (_, p) in enumerate(engines)},
                             table=settings.table.table_params(), busy_bin_seconds=window, seed=seed)
        result = Fleet(config, lambda proxy, rng: Ferry(rng, settings), requests).run()
        for k, i in enumerate(picked):
            s = result.served[k]
            refused[i] = s.rejected
            if not s.rejected:
                ttft[i], e2e[i], cached[i] = s.ttft, s.e2e, s.cached_tokens
        bins = np.asarray(result.busy[:windows], dtype=float)
        busy[:len(bins)] += bins
    return Outcome(ttft=ttft, e2e=e2e, cached=cached, refused=refused, busy=busy, replicas=replicas,
                   proxies=proxies, wall_seconds=time.monotonic() - started)


def auto_window(span: float) -> float:
    """A 1-2-5 window width (seconds) giving 10 to 30 windows over ``span``, nearest 20 (a shorter span: 20)."""
    if span <= 0:
        return 1.0
    target = span / 20
    exponent = math.floor(math.log10(target))
    widths = [m * 10.0 ** e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 2, 5)]
    return min(widths, key=lambda w: abs(math.log(span / w / 20)))


def window_index(rows: Sequence[Row], window: float) -> tuple[np.ndarray, int]:
    """Each row's window (by arrival) and the number of windows (at most :data:`MAX_WINDOWS`)."""
    if not window > 0:
        raise ConfigError("window", "must be positive")
    span = rows[-1].offset if rows else 0.0
    count = int(span // window) + 1
    if count > MAX_WINDOWS:
        raise ConfigError("window", f"{window:g} s makes {count} windows (at most {MAX_WINDOWS}): widen it")
    return np.minimum((np.array([r.offset for r in rows]) // window).astype(np.int64), count - 1), count


# --- figures, on all windows or a bootstrap draw of them ---

# metric -> (how a change is measured, which way is better: -1 lower, +1 higher, 0 neither)
METRICS: dict[str, tuple[str, int]] = {
    "ttft_p50_ms": ("ratio", -1),
    "ttft_p99_ms": ("ratio", -1),
    "e2e_p99_ms": ("ratio", -1),
    "hit_ratio": ("difference", +1),
    "refused_share": ("difference", -1),
    "gpu_utilisation": ("difference", 0),
}
_CHUNK = 4_000_000  # draws x requests per numpy block (32 MB of int64)


def _percentiles(values: np.ndarray, labels: np.ndarray, counts: np.ndarray, p: float) -> np.ndarray:
    """Nearest-rank percentile ``p`` of ``values`` (finite) per draw, each value weighted by how often its
    window (``labels``) was drawn (``counts``: draws x windows); NaN for a draw with no value."""
    draws = counts.shape[0]
    out: np.ndarray = np.full(draws, np.nan)
    if values.size == 0:
        return out
    order = np.argsort(values, kind="stable")
    ordered, by = values[order], labels[order]
    step = max(1, _CHUNK // values.size)
    for lo in range(0, draws, step):
        weights = counts[lo:lo + step][:, by]
        cum = np.cumsum(weights, axis=1)
        total = cum[:, -1]
        rank = np.maximum(1, np.ceil(p / 100.0 * total))
        at = np.minimum((cum < rank[:, None]).sum(axis=1), values.size - 1)
        out[lo:lo + step] = np.where(total > 0, ordered[at], np.nan)
    return out


@dataclasses.dataclass(frozen=True)
class _Windows:
    """Per-window sums of one outcome, and its answered requests' latencies with their windows."""

    ttft: np.ndarray
    ttft_at: np.ndarray
    e2e: np.ndarray
    e2e_at: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    refused: np.ndarray
    requests: np.ndarray
    busy: np.ndarray
    replica_seconds: np.ndarray

    @classmethod
    def of(cls, outcome: Outcome, prompt: np.ndarray, at: np.ndarray, count: int, window: float) -> _Windows:
        ok = ~outcome.refused & np.isfinite(outcome.ttft)
        done = ~outcome.refused & np.isfinite(outcome.e2e)
        return cls(ttft=outcome.ttft[ok], ttft_at=at[ok], e2e=outcome.e2e[done], e2e_at=at[done],
                   prompt=np.bincount(at, weights=prompt, minlength=count),
                   cached=np.bincount(at, weights=outcome.cached, minlength=count),
                   refused=np.bincount(at, weights=outcome.refused, minlength=count),
                   requests=np.bincount(at, minlength=count).astype(float),
                   busy=outcome.busy[:count], replica_seconds=np.full(count, outcome.replicas * window))

    def figures(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """Every metric per draw (``counts``: draws x windows, how often each window was drawn)."""
        c: np.ndarray = counts.astype(float)

        def share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
            d = c @ den
            out: np.ndarray = np.divide(c @ num, d, out=np.full(len(c), np.nan), where=d > 0)
            return out
        return {
            "ttft_p50_ms": 1000 * _percentiles(self.ttft, self.ttft_at, counts, 50),
            "ttft_p99_ms": 1000 * _percentiles(self.ttft, self.ttft_at, counts, 99),
            "e2e_p99_ms": 1000 * _percentiles(self.e2e, self.e2e_at, counts, 99),
            "hit_ratio": share(self.cached, self.prompt),
            "refused_share": share(self.refused, self.requests),
            "gpu_utilisation": share(self.busy, self.replica_seconds),
        }


def _change(kind: str, base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    out: np.ndarray
    if kind == "difference":
        out = cand - base
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where((base > 0) & np.isfinite(base), cand / base, np.nan)
    return out


def _num(value: float, digits: int = 4) -> float | None:
    return round(float(value), digits) if math.isfinite(value) else None


def interval(draws: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The central ``level`` of the finite draws (None, None: none finite)."""
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        return None, None
    lo, hi = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return _num(lo), _num(hi)


def verdict(kind: str, better: int, low: float | None, high: float | None) -> str:
    """``better``/``worse`` (or ``higher``/``lower`` for a figure neither way), else no significant change."""
    null = 1.0 if kind == "ratio" else 0.0
    if low is None or high is None or low <= null <= high:
        return "no significant change"
    up = low > null
    if better == 0:
        return "higher" if up else "lower"
    return "better" if up == (better > 0) else "worse"


def draws(windows: int, resamples: int, seed: int) -> np.ndarray:
    """How often each window is drawn in each of ``resamples`` bootstrap draws (resamples x windows)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, windows, size=(resamples, windows))
    out: np.ndarray = np.zeros((resamples, windows), dtype=np.int64)
    np.add.at(out, (np.arange(resamples)[:, None], picks), 1)
    return out


@dataclasses.dataclass(frozen=True)
class Paired:
    """Both configs' figures on all windows (``point``) and on each bootstrap draw (``boot``)."""

    point: tuple[dict[str, float], dict[str, float]]
    boot: tuple[dict[str, np.ndarray], dict[str, np.ndarray]]
    per_window: tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


def pair(rows: Sequence[Row], base: Outcome, cand: Outcome, *, window: float, resamples: int,
         seed: int) -> Paired:
    """The figures of both outcomes, on all windows, per window, and on ``resamples`` paired draws (the same
    draws for both: a paired bootstrap)."""
    at, count = window_index(rows, window)
    prompt = np.array([r.prompt_tokens for r in rows], dtype=float)
    sides = [_Windows.of(o, prompt, at, count, window) for o in (base, cand)]
    ones: np.ndarray = np.ones((1, count), dtype=np.int64)
    each: np.ndarray = np.eye(count, dtype=np.int64)
    boot = draws(count, resamples, seed)
    point = tuple({k: float(v[0]) for k, v in s.figures(ones).items()} for s in sides)
    return Paired(point=(point[0], point[1]), boot=(sides[0].figures(boot), sides[1].figures(boot)),
                  per_window=(sides[0].figures(each), sides[1].figures(each)))


def summary(rows: Sequence[Row], outcome: Outcome, window: float) -> dict[str, float]:
    """Every metric of one outcome over all its windows (NaN: no value)."""
    at, count = window_index(rows, window)
    prompt = np.array([r.prompt_tokens for r in rows], dtype=float)
    figures = _Windows.of(outcome, prompt, at, count, window).figures(np.ones((1, count), dtype=np.int64))
    return {k: float(v[0]) for k, v in figures.items()}


def recorded(rows: Sequence[Row]) -> dict[str, Any] | None:
    """What the recording measured, for comparison with the simulated baseline (None: no latency recorded)."""
    ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None and r.outcome in ANSWERED]
    e2e = [r.e2e_ms for r in rows if r.e2e_ms is not None and r.outcome in ANSWERED]
    if not ttft and not e2e:
        return None

    def nearest(values: list[float], p: float) -> float | None:
        return round(percentile(values, p), 1) if values else None
    cached = [(r.cached_tokens, r.prompt_tokens) for r in rows if r.cached_tokens is not None]
    prompt = sum(p for _, p in cached)
    return {"ttft_p50_ms": nearest(ttft, 50), "ttft_p99_ms": nearest(ttft, 99), "e2e_p99_ms": nearest(e2e, 99),
            "hit_ratio": round(sum(c for c, _ in cached) / prompt, 4) if prompt else None,
            "refused_share": round(sum(r.outcome not in ANSWERED for r in rows) / len(rows), 4),
            "ttft_samples": len(ttft)}


def compare(rows: Sequence[Row], fleet: FleetSpec, baseline: ProxySettings, candidate: ProxySettings, *,
            window: float | None = None, seed: int = 1, resamples: int = 1000,
            level: float = 0.95) -> dict[str, Any]:
    """The what-if of ``candidate`` against ``baseline`` on ``rows`` (see the module docstring), as JSON data."""
    if not rows:
        raise ConfigError("traffic", "no requests")
    if not 10 <= resamples <= 100_000:
        raise ConfigError("resamples", "must be 10..100000")
    if not 0.5 <= level < 1:
        raise ConfigError("level", "must be in [0.5, 1)")
    width = window or auto_window(rows[-1].offset)
    _, count = window_index(rows, width)
    runs = [simulate(rows, fleet, s, window=width, windows=count, seed=seed) for s in (baseline, candidate)]
    return report(rows, fleet, baseline, candidate, (runs[0], runs[1]), window=width, seed=seed,
                  resamples=resamples, level=level)


def report(rows: Sequence[Row], fleet: FleetSpec, baseline: ProxySettings, candidate: ProxySettings,
           runs: tuple[Outcome, Outcome], *, window: float, seed: int, resamples: int, level: float) -> dict[str, Any]:
    """The what-if result of two simulated outcomes of ``rows`` (:func:`compare`)."""
    width = window
    at, count = window_index(rows, width)
    paired = pair(rows, runs[0], runs[1], window=width, resamples=resamples, seed=seed)
    metrics = []
    for name, (kind, better) in METRICS.items():
        b, c = paired.point[0][name], paired.point[1][name]
        low, high = interval(_change(kind, paired.boot[0][name], paired.boot[1][name]), level)
        estimate = float(_change(kind, np.array([b]), np.array([c]))[0])
        metrics.append({"metric": name, "baseline": _num(b, 4), "candidate": _num(c, 4), "change": kind,
                        "estimate": _num(estimate), "low": low, "high": high,
                        "verdict": verdict(kind, better, low, high)})
    refused = [int(o.refused.sum()) for o in runs]
    per_window_requests = np.bincount(at, minlength=count)
    per_window = [{"start_s": round(k * width, 3), "requests": int(per_window_requests[k]),
                   "baseline": {m: _num(float(paired.per_window[0][m][k])) for m in METRICS},
                   "candidate": {m: _num(float(paired.per_window[1][m][k])) for m in METRICS}}
                  for k in range(count)]
    models: dict[str, int] = {}
    for m in _model_of(rows, fleet):
        models[m] = models.get(m, 0) + 1
    return {
        "requests": len(rows), "span_s": round(rows[-1].offset, 3), "models": models,
        "proxies": runs[0].proxies, "replicas": runs[0].replicas,
        "window_s": width, "windows": count, "seed": seed, "resamples": resamples, "level": level,
        "baseline": {"changed": _jsonable(changed(baseline)), "refused": refused[0],
                     "wall_seconds": round(runs[0].wall_seconds, 3)},
        "candidate": {"changed": _jsonable(changed(candidate)), "refused": refused[1],
                      "wall_seconds": round(runs[1].wall_seconds, 3),
                      "changed_from_baseline": _jsonable(changed(candidate, baseline))},
        "metrics": metrics,
        "per_window": per_window,
        "recorded": recorded(rows),
    }


def _jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _show(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    return f"x{value:.3f}" if kind == "ratio" else f"{value:+.4f}"


def render(result: Mapping[str, Any]) -> str:
    """The side-by-side table of a :func:`compare` result, with a line on how to read it."""
    pct = f"{result['level'] * 100:g} %"
    models = ", ".join(f"{m}: {n}" for m, n in result["models"].items())
    proxies = f"{result['proxies']} prox{'y' if result['proxies'] == 1 else 'ies'}"
    lines = [f"what-if: {result['requests']} requests over {result['span_s']:.0f} s ({models}), {proxies}, "
             f"{result['replicas']} replicas; {result['windows']} windows of "
             f"{result['window_s']:g} s, {result['resamples']} paired resamples, seed {result['seed']}",
             "candidate changes: " + (", ".join(f"{k} = {v}" for k, v in
                                               result["candidate"]["changed_from_baseline"].items()) or "none"),
             ""]
    header = f"{'metric':<16} {'baseline':>10} {'candidate':>10} {'change':>10} {pct + ' interval':>22}  verdict"
    lines.append(header)
    for m in result["metrics"]:
        shape = ".1f" if m["metric"].endswith("_ms") else ".4f"
        b = "-" if m["baseline"] is None else format(m["baseline"], shape)
        c = "-" if m["candidate"] is None else format(m["candidate"], shape)
        span = f"[{_show(m['low'], m['change'])}, {_show(m['high'], m['change'])}]"
        lines.append(f"{m['metric']:<16} {b:>10} {c:>10} {_show(m['estimate'], m['change']):>10} {span:>22}  "
                     f"{m['verdict']}")
    lines.append("")
    lines.append(f"refused: {result['baseline']['refused']} (baseline), {result['candidate']['refused']} "
                 f"(candidate); simulated in {result['baseline']['wall_seconds']:.1f} s + "
                 f"{result['candidate']['wall_seconds']:.1f} s")
    rec = result.get("recorded")
    if rec:
        lines.append(f"recorded: ttft p50 {rec['ttft_p50_ms']} ms, p99 {rec['ttft_p99_ms']} ms, e2e p99 "
                     f"{rec['e2e_p99_ms']} ms, hit ratio {rec['hit_ratio']}, refused share {rec['refused_share']}")
    lines.append(f"change: candidate / baseline (x) or candidate - baseline (+/-); a verdict needs the {pct} "
                 f"interval to exclude no change (x1, +0)")
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: str | Path) -> Path:
    """A PNG of ``result``: per-window TTFT p99 of both configs, and every change with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    fig = plt.figure(figsize=(11, 8), constrained_layout=True)
    grid = fig.add_gridspec(2, 2)
    top = fig.add_subplot(grid[0, :])
    starts = [w["start_s"] for w in result["per_window"]]
    for side, colour, marker, width in (("baseline", "tab:gray", "s", 1.5), ("candidate", "tab:blue", "*", 3)):
        values = [np.nan if w[side]["ttft_p99_ms"] is None else w[side]["ttft_p99_ms"] for w in result["per_window"]]
        top.plot(starts, values, marker=marker, color=colour, linewidth=width, label=side)
    top.set_xlabel(f"window start (s; windows of {result['window_s']:g} s)")
    top.set_ylabel("TTFT p99 (ms)")
    top.grid(True, which="both", alpha=0.3)
    top.legend(loc="upper left", fontsize=9)
    for ax, kind, null, label in ((fig.add_subplot(grid[1, 0]), "ratio", 1.0, "candidate / baseline"),
                                  (fig.add_subplot(grid[1, 1]), "difference", 0.0, "candidate - baseline")):
        shown = [m for m in result["metrics"] if m["change"] == kind and m["estimate"] is not None]
        for y, m in enumerate(shown):
            colour = {"better": "tab:green", "worse": "tab:red"}.get(m["verdict"], "tab:blue")
            low = m["low"] if m["low"] is not None else m["estimate"]
            high = m["high"] if m["high"] is not None else m["estimate"]
            ax.errorbar([m["estimate"]], [y], xerr=[[m["estimate"] - low], [high - m["estimate"]]], fmt="o",
                        color=colour, capsize=5, markersize=7)
        ax.axvline(null, color="black", linewidth=1)
        ax.set_yticks(range(len(shown)), [m["metric"] for m in shown])
        ax.set_ylim(-0.5, len(shown) - 0.5)
        ax.set_xlabel(f"{label}, {result['level'] * 100:g} % interval")
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"what-if: {result['requests']} requests, {result['replicas']} replicas, {result['proxies']} "
                 f"proxies, {result['windows']} windows of {result['window_s']:g} s, {result['resamples']} paired "
                 f"resamples (green: better, red: worse)", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
