"""Settings of the decision, beside the component they configure: ``PickSettings``, ``OutlierSettings``.

The ``[proxy]`` keys of the pick (``walk_limit``, ``prefix_depths``,
``telemetry_*``, …) and of outlier ejection (``outlier_*``,
``unreachable_*``) are fields of these frozen dataclasses;
:class:`dataplane.config.ProxySettings` composes them with the other parts.
The decision's composition is the ``[proxy.pick]`` table (the field ``pick``
of :class:`PickSettings`, kept as the file's mapping; :meth:`PickSettings.plan`
reads it as :class:`PlanSettings`)::

    [proxy.pick]
    filters = ["tried", "ejected", "avoid", "tried_nodes", "room", "fresh"]
    picker = "prefix"

    [[proxy.pick.scorers]]
    type = "load"
    weight = 1.0

    [[proxy.pick.scorers]]
    type = "kv"
    weight = 0.5

    [[proxy.pick.scorers]]
    type = "staleness"
    weight = 1.0

which is the default (today's decision). Each name is a type of the one
registry (:mod:`dataplane.pick.plugin`); a scorer's ``params`` table holds
its own parameters (``staleness``: ``fresh_seconds``, ``stale_seconds``,
default the ``telemetry_*`` keys). The names are checked against the
registry where the composition is built (:func:`dataplane.pick.plugin.compose`,
ConfigError naming ``proxy.pick.scorers[1].type`` and the known types);
here only their shape.

Imports nothing of the data plane beyond the pick's leaf modules (so
:mod:`dataplane.config` imports this, never the other way).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

from dataplane.pick.outlier import OutlierParams
from dataplane.pick.prefix import DEPTHS
from dataplane.pick.unreachable import UnreachableParams
from ferry.config import at_least_zero, from_mapping, positive
from ferry.errors import ConfigError

DEFAULT_FILTERS = ("tried", "ejected", "avoid", "tried_nodes", "room", "fresh")
DEFAULT_PICKER = "prefix"
MAX_PLUGINS = 32  # filters, and scorers, per composition


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScorerSettings:
    """One ``[[proxy.pick.scorers]]`` entry: a scorer type, its weight in the sum, its own parameters."""

    type: str
    weight: float = 1.0
    params: Mapping[str, float] = dataclasses.field(default_factory=dict)  # checked by the scorer's factory


DEFAULT_SCORERS = (ScorerSettings(type="load", weight=1.0), ScorerSettings(type="kv", weight=0.5),
                   ScorerSettings(type="staleness", weight=1.0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """The ``[proxy.pick]`` table: the decision's filters (in precedence order), scorers and picker, by type name.

    Soft filters give way last listed first when nothing else is left (:mod:`dataplane.pick.plugin`).
    """

    filters: tuple[str, ...] = DEFAULT_FILTERS
    scorers: tuple[ScorerSettings, ...] = DEFAULT_SCORERS
    picker: str = DEFAULT_PICKER

    def __post_init__(self) -> None:
        if len(self.filters) > MAX_PLUGINS or len(self.scorers) > MAX_PLUGINS:
            raise ConfigError("proxy.pick", f"at most {MAX_PLUGINS} filters and {MAX_PLUGINS} scorers")
        for i, name in enumerate(self.filters):
            if name in self.filters[:i]:
                raise ConfigError(f"proxy.pick.filters[{i}]", f"{name!r} is listed twice")
        if not self.picker:
            raise ConfigError("proxy.pick.picker", "must name a picker")
        for i, scorer in enumerate(self.scorers):
            if not math.isfinite(scorer.weight):
                raise ConfigError(f"proxy.pick.scorers[{i}].weight", f"must be a finite number, got {scorer.weight}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PickSettings:
    """The decision's settings (:class:`dataplane.pick.state.PickState`, :class:`.decide.DecideParams`)."""

    prefix_depths: tuple[int, ...] = DEPTHS
    walk_limit: int = 8
    detour_factor: float = 24.0  # the detour threshold: this x the learned advantage x the mean prompt (picker)
    place_factor: float = 3.0  # a new key leaves its home for a less busy one of its walk by this x adv. x mean
    placements: int = 65_536  # prefix keys remembered with the replica they went to (dataplane.pick.decide.Placements)
    hot_keys: int = 256
    hot_window: int = 1024
    telemetry_fresh_seconds: float = 1.0
    telemetry_stale_seconds: float = 6.0
    # [proxy.pick]: the composition, as the file's table (a plain mapping, so that it passes through every reader of
    # the flat keys as is); its shape is checked here (plan()), its type names where it is composed
    pick: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        positive("proxy", {"walk_limit": self.walk_limit, "hot_keys": self.hot_keys, "hot_window": self.hot_window})
        if not 0 <= self.telemetry_fresh_seconds < self.telemetry_stale_seconds:
            raise ConfigError("proxy.telemetry_stale_seconds", "must exceed telemetry_fresh_seconds (>= 0)")
        depths = self.prefix_depths
        if not depths or depths[0] < 1 or any(b <= a for a, b in itertools.pairwise(depths)):
            raise ConfigError("proxy.prefix_depths", "must be increasing block counts, the first >= 1")
        at_least_zero("proxy", {"detour_factor": self.detour_factor, "place_factor": self.place_factor,
                                "placements": self.placements})
        self.plan()

    def plan(self) -> PlanSettings:
        """The ``[proxy.pick]`` table read (the defaults for the keys it leaves out); ConfigError naming the key."""
        return plan_settings(self.pick)


def plan_settings(table: Any, where: str = "proxy.pick") -> PlanSettings:
    """A ``[proxy.pick]`` table as :class:`PlanSettings`; ConfigError naming ``proxy.pick.<key>``."""
    if isinstance(table, PlanSettings):
        return table
    return from_mapping(PlanSettings, table, where)  # validated by its declaration, as every section is


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutlierSettings:
    """Outlier ejection's settings (:class:`dataplane.pick.outlier.OutlierParams`, checked there)."""

    outlier_consecutive_failures: int = 5  # failures in a row …
    outlier_latency_factor: float = 5.0  # … or a decode or prefill rate above this many times the peers' median
    outlier_window_seconds: float = 10.0  # the rates' time constant
    outlier_min_decode_tokens: int = 4  # tokens after the first that make a decode sample
    outlier_min_prefill_tokens: int = 4096  # uncached prompt tokens that make a prefill sample
    outlier_base_ejection_seconds: float = 2.0  # doubling per ejection in a row, up to outlier_max_ejection_seconds
    outlier_max_ejection_seconds: float = 60.0
    outlier_max_ejected_share: float = 0.1  # of a model's replicas at once (at least one)
    unreachable_probe_seconds: float = 5.0  # a refused replica is probed again after this (doubling), unless a
    unreachable_max_probe_seconds: float = 60.0  # table brings telemetry newer than the refusal first

    def unreachable_params(self) -> UnreachableParams:
        """The refused replicas' parameters (:class:`dataplane.pick.unreachable.Unreachable`)."""
        return UnreachableParams(probe_seconds=self.unreachable_probe_seconds,
                                 max_probe_seconds=self.unreachable_max_probe_seconds)

    def params(self) -> OutlierParams:
        """The outlier detector's parameters (raises ConfigError naming ``proxy.outlier``)."""
        return OutlierParams(
            consecutive_failures=self.outlier_consecutive_failures, latency_factor=self.outlier_latency_factor,
            window_seconds=self.outlier_window_seconds, min_decode_tokens=self.outlier_min_decode_tokens,
            min_prefill_tokens=self.outlier_min_prefill_tokens,
            base_ejection_seconds=self.outlier_base_ejection_seconds,
            max_ejection_seconds=self.outlier_max_ejection_seconds, max_ejected_share=self.outlier_max_ejected_share)
