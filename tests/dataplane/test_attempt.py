"""One attempt loop (dataplane.attempt.AttemptLoop): the proxy, the endpoint picker and the simulator drive it.

A spy on the loop's class sees each of them decide, send and (the simulator, on an engine's refusal) ask the
retry rule through it, and nothing else retries in the simulator's policy. A spy on the admission gate's class
(dataplane.admission.gate.Admission) sees the proxy offer and release through it and the simulator offer, release
and expire through it (and start what it dispatches at a table tick); the simulator's policy has no queue logic of
its own."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import random
from collections import Counter
from typing import Any

import pytest

import tools.sim.policies
import tools.sim.regions
import tools.sim.tiers
from agent.replica.engine import EngineParams
from dataplane.admission.gate import Admission, Offered
from dataplane.admission.queues import Shed, Ticket
from dataplane.attempt import AttemptLoop, Tried
from dataplane.config import ProxySettings
from dataplane.pick.p2c import Decision
from dataplane.pick.state import Attempt
from dataplane.table.local import Table
from ferry.errors import FerryError
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour
from tests.epp import test_protocol
from tests.epp.test_protocol import completion, finish, idle, routed
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import Ferry
from tools.sim.workload import SimRequest

picker = test_protocol.picker  # the fixture: an in-process endpoint picker on a fake control plane

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """Counts (method, model) of every decide, send and retry on any AttemptLoop."""
    calls: Counter[tuple[str, str]] = Counter()
    real_decide, real_send, real_retry = AttemptLoop.decide, AttemptLoop.send, AttemptLoop.retry

    def decide(self: AttemptLoop, request: Tried, *args: Any, **kwargs: Any) -> Decision:
        calls["decide", request.model_label] += 1
        return real_decide(self, request, *args, **kwargs)

    def send(self: AttemptLoop, request: Tried, *args: Any, **kwargs: Any) -> Attempt:
        calls["send", request.model_label] += 1
        return real_send(self, request, *args, **kwargs)

    def retry(self: AttemptLoop, request: Tried, error: FerryError) -> bool:
        calls["retry", request.model_label] += 1
        return real_retry(self, request, error)

    monkeypatch.setattr(AttemptLoop, "decide", decide)
    monkeypatch.setattr(AttemptLoop, "send", send)
    monkeypatch.setattr(AttemptLoop, "retry", retry)
    return calls


async def test_the_proxy_and_the_picker_drive_the_attempt_loop(rig, picker, spy) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert r.proxy is not None and isinstance(r.proxy.router.loop, AttemptLoop)
    assert (spy["decide", "m"], spy["send", "m"]) == (1, 1)  # the proxy's relay
    p = await picker()
    handed = await routed(p, completion())
    await finish(p, handed)
    await idle(p)
    assert (spy["decide", "m"], spy["send", "m"]) == (2, 2)  # the picker's hand-off: one more of each


def test_the_simulator_drives_the_same_attempt_loop_and_retries_through_it(spy) -> None:
    """Engines with room for one queued request each and no tier queue before them: some refuse, and the policy
    asks the loop's retry rule."""
    settings = ProxySettings.from_section({"admission": False})
    engine = dataclasses.replace(EngineParams(max_running=2, kv_blocks_total=256, prefix_cache_blocks=256), max_queue=1)
    requests = [SimRequest(i, 0.001 * i, 100, 50, (10_000 + i,)) for i in range(12)]
    fleet = Fleet(FleetConfig(replicas=2, proxies=1, engine=engine), lambda p, rng: Ferry(rng, settings), requests)
    result = fleet.run()
    (policy,) = fleet.policies
    assert isinstance(policy, Ferry) and isinstance(policy.loop, AttemptLoop)
    attempts = sum(s.attempts for s in result.served)
    assert spy["send", "chat"] == attempts and spy["decide", "chat"] >= attempts
    assert spy["retry", "chat"] > 0  # every refusal went through the loop's rule and budget


@pytest.fixture
def gate_spy(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every offer (``shed``: those refused), release and expiry (``expired``: those that refused a waiting
    ticket) on any Admission."""
    calls: Counter[str] = Counter()
    real_offer, real_release, real_expire = Admission.offer, Admission.release, Admission.expire

    def offer(self: Admission, model: str, ticket: Ticket) -> Offered:
        calls["offer"] += 1
        try:
            return real_offer(self, model, ticket)
        except Shed:
            calls["shed"] += 1
            raise

    def release(self: Admission, model: str, ticket: Ticket) -> list[Ticket]:
        calls["release"] += 1
        return real_release(self, model, ticket)

    def expire(self: Admission, model: str, ticket: Ticket) -> bool:
        expired = real_expire(self, model, ticket)
        calls["expired"] += expired
        return expired

    monkeypatch.setattr(Admission, "offer", offer)
    monkeypatch.setattr(Admission, "release", release)
    monkeypatch.setattr(Admission, "expire", expire)
    return calls


async def test_the_proxy_admits_through_the_gate(rig, gate_spy) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert r.proxy is not None and r.proxy.router.loop.gate is r.proxy.router.admission
    assert (gate_spy["offer"], gate_spy["release"]) == (1, 1)


def test_the_simulator_admits_through_the_same_gate_and_its_waits_expire_there(gate_spy) -> None:
    """Two replicas of two slots, twenty requests within 20 ms and a 50 ms queue timeout: four start; the gate
    refuses most others at once (their expected wait is longer than the timeout), and at least one waits and is
    refused by the gate's expiry at its limit; every refusal is the gate's, every start gives its slot back."""
    settings = ProxySettings.from_section({"queue_timeouts": [0.05, 0.05, 0.05]})
    engine = EngineParams(max_running=2, kv_blocks_total=256, prefix_cache_blocks=256)
    requests = [SimRequest(i, 0.001 * i, 100, 50, (20_000 + i,)) for i in range(20)]
    fleet = Fleet(FleetConfig(replicas=2, proxies=1, engine=engine), lambda p, rng: Ferry(rng, settings), requests)
    result = fleet.run()
    (policy,) = fleet.policies
    assert isinstance(policy, Ferry) and policy.loop.gate is policy.admission
    rejected = sum(s.rejected for s in result.served)
    assert gate_spy["offer"] == len(requests)
    assert gate_spy["expired"] >= 1 and gate_spy["shed"] + gate_spy["expired"] == rejected <= len(requests) - 4
    assert gate_spy["release"] == len(requests) - rejected  # every started request gave its slot back


def test_the_fleet_starts_what_a_grown_gate_dispatches_at_the_table_tick() -> None:
    """One slot of four at first (a capacity share of 0.25); at the first table tick (0.5 s) the share becomes 1.0:
    the waiting requests start at that tick, while the first is still running, not when it ends."""
    settings = ProxySettings.from_section({"admission_capacity_share": 0.25, "queue_timeouts": [30.0, 30.0, 30.0]})

    def grown(proxy: int, rng: random.Random) -> Ferry:
        policy = Ferry(rng, settings)
        apply = policy.apply

        def apply_grown(table: Table) -> list[int]:
            if table.applied_at > 0:
                policy.admission.capacity_share = 1.0
            return apply(table)

        policy.apply = apply_grown  # type: ignore[method-assign]
        return policy

    engine = EngineParams(max_running=2, kv_blocks_total=256, prefix_cache_blocks=256)
    requests = [SimRequest(i, 0.001 * i, 100, 400, (30_000 + i,)) for i in range(4)]
    result = Fleet(FleetConfig(replicas=2, proxies=1, engine=engine), grown, requests).run()
    first, *waited = result.served
    assert not any(s.rejected for s in result.served) and first.e2e is not None and first.e2e > 0.6
    for served, req in zip(waited, requests[1:], strict=True):
        assert served.ttft is not None
        assert 0.5 <= req.arrival + served.ttft < first.e2e  # started at the tick, before the first ended


def test_the_simulators_policy_has_no_retry_rule_budget_or_queue_logic_of_its_own() -> None:
    """What the policy module may name: the loop and the gate, not the rule, the budget, the capacity or the
    queues' own operations (offer, dispatch, timeouts are the gate's)."""
    tree = ast.parse(inspect.getsource(tools.sim.policies))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not {"retry_reason", "charged", "try_spend", "budget", "max_attempts", "retry_tiers", "Ask",
                "max_concurrency", "TierQueues", "sized", "targets", "dispatch", "finish", "cancel",
                "queue_timeouts", "timeouts", "local_queue"} & (names | imported)
    assert {"AttemptLoop", "Admission"} <= imported


def test_no_simulator_sizes_tier_queues_by_itself() -> None:
    """Every simulator's tier queues come from the one sizing rule (admission.queues.sized), the fleet
    simulator's through the proxy's gate itself."""
    for module in (tools.sim.policies, tools.sim.tiers, tools.sim.regions):
        tree = ast.parse(inspect.getsource(module))
        calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert {"sized", "Admission"} & calls and not {"TierQueues", "set_replicas"} & calls, module.__name__
