"""One attempt loop (dataplane.attempt.AttemptLoop): the proxy, the endpoint picker and the simulator drive it.

A spy on the loop's class sees each of them decide, send and (the simulator, on an engine's refusal) ask the
retry rule through it, and nothing else retries in the simulator's policy."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections import Counter
from typing import Any

import pytest

import tools.sim.policies
import tools.sim.regions
import tools.sim.tiers
from agent.replica.engine import EngineParams
from dataplane.attempt import AttemptLoop, Tried
from dataplane.config import ProxySettings
from dataplane.pick.p2c import Decision
from dataplane.pick.state import Attempt
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


def test_the_simulators_policy_has_no_retry_rule_budget_or_queue_sizing_of_its_own() -> None:
    """What the policy module may name: the loop and the gate's sizing, not the rule, the budget or the capacity."""
    tree = ast.parse(inspect.getsource(tools.sim.policies))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not {"retry_reason", "charged", "try_spend", "budget", "max_attempts", "retry_tiers", "Ask",
                "max_concurrency"} & (names | imported)
    assert {"AttemptLoop", "sized", "targets"} <= imported


def test_no_simulator_sizes_tier_queues_by_itself() -> None:
    """Every simulator's tier queues come from the one sizing rule (admission.queues.sized)."""
    for module in (tools.sim.policies, tools.sim.tiers, tools.sim.regions):
        tree = ast.parse(inspect.getsource(module))
        calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "sized" in calls and not {"TierQueues", "set_replicas"} & calls, module.__name__
