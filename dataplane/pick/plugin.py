"""The decision as plug-ins: ``Filter``, ``Scorer`` and ``Picker`` protocols, one registry, the composed :class:`Plan`.

A plug-in is a class with a type name (``type_name``), a kind (``filter``,
``scorer``, ``picker``), the telemetry it consumes (``consumes``: the
:class:`dataplane.table.pool.Replica` fields, or the proxy's own state, it
reads; documentation and the debug log's key) and a factory from its
parameters (``build(args)``). :data:`REGISTRY` maps each type name to its
class; :func:`register` adds one (a decorator), and the built-in ones are
registered when :func:`compose` first runs: :mod:`dataplane.pick.filters`,
:mod:`dataplane.pick.pickers`, and every module of the package
:mod:`dataplane.pick.scorers` (one file a scorer: adding a file adds a
scorer, nothing else to edit).

Kinds, and how :func:`dataplane.pick.decide.decide` runs them:

- **Filter**, by ``stage``. ``hard``: the replica ids and nodes it takes out
  (:meth:`Filter.off`) stay out (``tried``). ``soft``: taken out while
  another replica is left; when none is, the soft filters give way last
  listed first (default ``ejected``, ``avoid``, ``tried_nodes``: the tried
  nodes give way first, the ejected last). ``taker``: checked per replica
  where a replica takes a prefix key (:meth:`Filter.takes`: the remembered
  replica, the ring walk; default ``room``, ``fresh``). The context limit is
  not a plug-in: a request longer than every replica's is refused
  (``too_long``), and the first replica of a key's walk with the context is
  its home.
- **Scorer**: a raw term per replica (:meth:`Scorer.score`, lower is better);
  the cost of a replica is ``sum(weight x term)`` in the listed order
  (:meth:`Plan.cost`; default ``load`` 1.0, ``kv`` 0.5, ``staleness`` 1.0,
  the formula of :func:`dataplane.pick.p2c.score`).
- **Picker**: the strategy over the filtered replicas, the filters and the
  cost (:meth:`Picker.pick`): ``prefix`` (affinity, the bounded-load ring,
  placement, detour, then P2C: today's decision) or ``p2c`` (power of two
  choices on the cost alone).

Configuration: the ``[proxy.pick]`` table (:class:`dataplane.pick.settings.PlanSettings`);
:func:`compose` builds the :class:`Plan` and refuses a bad one with a
ConfigError naming the key (``proxy.pick.scorers[1].type: unknown scorer
"x"; known: kv, load, staleness``).

Per-step metrics and the debug log: :class:`Steps` (a sink of
``(step, branch, seconds)``, bounded labels: :data:`STEPS` x
:class:`dataplane.pick.p2c.Branch`) and :class:`Notes` (the raw per-scorer
terms of the replicas the decision weighed), both optional in
:class:`dataplane.pick.decide.Local`.

Cost: :meth:`Plan.cost` O(scorers); :meth:`Plan.off` O(filters) set unions,
O(candidates) when a hard or soft filter takes something out.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from dataplane.pick.p2c import Decision, LocalLoad, Need
from dataplane.pick.settings import PickSettings, PlanSettings
from dataplane.table.pool import Replica
from ferry.errors import ConfigError

# The decision's request, this proxy's state and the parameters (dataplane.pick.decide's Ask, Local and
# DecideParams): named, not imported, so that the registry stays below the decision that composes it.
Ask = Any
Local = Any
DecideParams = Any

__all__ = ["REGISTRY", "STEPS", "Args", "Filter", "Notes", "Picker", "Plan", "Scorer", "Steps", "compose",
           "default_plan", "known", "register"]

Kind = Literal["filter", "scorer", "picker"]
Stage = Literal["hard", "soft", "taker"]
STEPS = ("region", "filter", "pick")  # the steps timed (metric label ``step``)
NOTHING: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class Args:
    """What a factory gets: where its entry is (for errors), its weight and parameters, the pick's settings."""

    where: str
    pick: PickSettings
    weight: float = 1.0
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def number(self, name: str, default: float) -> float:
        """The parameter ``name`` (a finite number), else ``default``; ConfigError naming it."""
        value = self.params.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ConfigError(f"{self.where}.params.{name}", f"must be a number, got {value!r}")
        return float(value)

    def only(self, *names: str) -> None:
        """Refuse a parameter not in ``names``, naming it and the known ones."""
        for name in self.params:
            if name not in names:
                raise ConfigError(f"{self.where}.params.{name}",
                                  f"unknown parameter (known: {', '.join(names) or 'none'})")


@runtime_checkable
class Filter(Protocol):
    """Takes replicas out of a decision: by id and node before the strategy (hard, soft), or per taker."""

    kind: ClassVar[Kind]
    type_name: ClassVar[str]
    consumes: ClassVar[tuple[str, ...]]
    stage: Stage

    @classmethod
    def build(cls, args: Args) -> Filter: ...

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        """(replica ids, nodes) this filter takes out of this attempt (hard and soft stages)."""
        ...

    def takes(self, replica: Replica, need: Need, age: float) -> bool:
        """Whether ``replica``, its telemetry ``age`` seconds old, may take the request's key (taker stage)."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """One term of a replica's cost (lower is better), weighted in the sum."""

    kind: ClassVar[Kind]
    type_name: ClassVar[str]
    consumes: ClassVar[tuple[str, ...]]
    weight: float

    @classmethod
    def build(cls, args: Args) -> Scorer: ...

    def score(self, replica: Replica, need: Need, load: LocalLoad, age: float) -> float:
        """The raw term of ``replica`` for a request needing ``need`` (``age``: its telemetry's, seconds)."""
        ...


@runtime_checkable
class Picker(Protocol):
    """The strategy: the replica (and branch) among the candidates, with the plan's filters and cost."""

    kind: ClassVar[Kind]
    type_name: ClassVar[str]
    consumes: ClassVar[tuple[str, ...]]

    @classmethod
    def build(cls, args: Args) -> Picker: ...

    def pick(self, params: DecideParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
             candidates: Sequence[Replica], off: frozenset[str], off_nodes: frozenset[str]) -> Decision:
        """The decision among ``candidates`` (context-filtered), ``off`` and ``off_nodes`` taken out."""
        ...


Plugin = Filter | Scorer | Picker
REGISTRY: dict[str, type[Any]] = {}  # type name -> plug-in class (its ``build`` is the factory)


def register(cls: type[Any]) -> type[Any]:
    """Add a plug-in class to :data:`REGISTRY` under its ``type_name`` (a class decorator)."""
    name, kind = getattr(cls, "type_name", ""), getattr(cls, "kind", "")
    if not name or kind not in ("filter", "scorer", "picker") or not callable(getattr(cls, "build", None)):
        raise TypeError(f"{cls.__name__}: a plug-in needs a type_name, a kind and a build(args) factory")
    if REGISTRY.get(name, cls) is not cls:
        raise TypeError(f"plug-in type {name!r} is registered twice ({REGISTRY[name].__name__}, {cls.__name__})")
    REGISTRY[name] = cls
    return cls


_BUILTINS = ("dataplane.pick.filters", "dataplane.pick.pickers")
_SCORERS = "dataplane.pick.scorers"


def _load_builtins() -> None:
    """Import the built-in plug-ins (each registers itself): the filters, the pickers, each scorer's file."""
    for module in _BUILTINS:
        importlib.import_module(module)
    package = importlib.import_module(_SCORERS)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{_SCORERS}.{info.name}")


def known(kind: Kind, *, builtin: bool = False) -> list[str]:
    """The registered type names of ``kind``, sorted; ``builtin``: only those of this package (the schema's)."""
    _load_builtins()
    return sorted(name for name, cls in REGISTRY.items()
                  if cls.kind == kind and (not builtin or cls.__module__.startswith(f"{__package__}.")))


def _make(kind: Kind, name: Any, args: Args) -> Any:
    _load_builtins()
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None or cls.kind != kind:
        raise ConfigError(f"{args.where}.type" if kind == "scorer" else args.where,
                          f'unknown {kind} "{name}"; known: {", ".join(known(kind))}')
    return cls.build(args)


class Steps(Protocol):
    """Where a decision's step times go (:class:`dataplane.metrics.PickSteps`): step, branch, seconds."""

    def observe(self, step: str, branch: str, seconds: float) -> None: ...


Notes = list[tuple[str, dict[str, float], float]]  # per replica weighed: (id, raw term per scorer type, cost)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """A composed decision: filters by stage, weighted scorers, the picker (see the module docstring)."""

    hard: tuple[Filter, ...]
    soft: tuple[Filter, ...]          # in precedence order: the last gives way first
    takers: tuple[Filter, ...]
    scorers: tuple[Scorer, ...]
    picker: Picker
    settings: PlanSettings = dataclasses.field(default_factory=PlanSettings)

    def cost(self, replica: Replica, need: Need, load: LocalLoad, age: float, notes: Notes | None = None) -> float:
        """``sum(weight x term)`` over the scorers, in order; the terms go to ``notes`` when given."""
        total = 0.0
        if notes is None:
            for s in self.scorers:
                total += s.weight * s.score(replica, need, load, age)
            return total
        terms = {}
        for s in self.scorers:
            term = terms[s.type_name] = s.score(replica, need, load, age)
            total += s.weight * term
        notes.append((replica.replica_id, terms, total))
        return total

    def takes(self, replica: Replica, need: Need, age: float) -> bool:
        """Whether every taker filter lets ``replica`` take the key."""
        for f in self.takers:  # noqa: SIM110 (a loop, not a generator, per replica met on the walk)
            if not f.takes(replica, need, age):
                return False
        return True

    def off(self, candidates: Sequence[Replica], ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        """(replica ids, nodes) to skip: the hard filters always; the soft ones while something else is left."""
        hard = [f.off(ask, local) for f in self.hard]
        soft = [f.off(ask, local) for f in self.soft]
        if not any(ids or nodes for ids, nodes in hard) and not any(ids or nodes for ids, nodes in soft):
            return NOTHING, NOTHING
        ids0 = NOTHING.union(*(ids for ids, _ in hard))
        nodes0 = NOTHING.union(*(nodes for _, nodes in hard))
        for keep in range(len(soft), 0, -1):  # the soft filters give way last listed first
            ids = ids0.union(*(ids for ids, _ in soft[:keep]))
            nodes = nodes0.union(*(nodes for _, nodes in soft[:keep]))
            if any(r.replica_id not in ids and r.node not in nodes for r in candidates):
                return ids, nodes
        return ids0, nodes0


def compose(pick: PickSettings) -> Plan:
    """The :class:`Plan` of ``pick.pick`` (``[proxy.pick]``); ConfigError naming the key at fault."""
    plan = pick.plan()
    stages: dict[str, list[Filter]] = {"hard": [], "soft": [], "taker": []}
    for i, name in enumerate(plan.filters):
        f: Filter = _make("filter", name, Args(f"proxy.pick.filters[{i}]", pick))
        stages[f.stage].append(f)
    scorers: list[Scorer] = []
    for i, entry in enumerate(plan.scorers):
        where = f"proxy.pick.scorers[{i}]"
        scorers.append(_make("scorer", entry.type, Args(where, pick, float(entry.weight), entry.params)))
    if not scorers:
        raise ConfigError("proxy.pick.scorers", "needs at least one scorer")
    picker: Picker = _make("picker", plan.picker, Args("proxy.pick.picker", pick))
    return Plan(tuple(stages["hard"]), tuple(stages["soft"]), tuple(stages["taker"]), tuple(scorers), picker, plan)


@functools.cache
def default_plan() -> Plan:
    """Today's decision: the default ``[proxy.pick]``."""
    return compose(PickSettings())


def describe(plan: Plan) -> dict[str, list[str]]:
    """What ``plan`` is made of, by kind, with what each part consumes (for logs and ``ferryctl``)."""
    def one(items: Iterable[Any]) -> list[str]:
        return [f"{p.type_name}({', '.join(p.consumes)})" for p in items]
    return {"filters": one((*plan.hard, *plan.soft, *plan.takers)), "scorers": one(plan.scorers),
            "picker": one((plan.picker,))}

