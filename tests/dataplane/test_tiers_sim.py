"""The tier simulator over the proxy's queue code: nothing lost, nothing answered twice, every refusal explained."""

from __future__ import annotations

import pytest

from agent.replica.engine import EngineParams
from dataplane.admission.queues import QueueParams
from tools.sim.tiers import Req, TierSim

ENGINE = EngineParams(max_running=8)


def _run(reqs: list[Req], until: float = 120.0) -> TierSim:
    return TierSim(replicas=2, engine=ENGINE, queues=QueueParams()).run(reqs, until)


@pytest.mark.parametrize(("interactive_rate", "expect_preempted"), [(0.0, False), (40.0, True)],
                         ids=["batch-alone", "interactive-step"])
def test_batch_backlog_is_requeued_never_lost(interactive_rate: float, expect_preempted: bool) -> None:
    reqs = [Req(rid=i, arrival=0.0, tier="batch", max_tokens=50 + i % 30, deadline=200.0) for i in range(48)]
    n = int(interactive_rate * 3)
    reqs += [Req(rid=100 + i, arrival=1.0 + i / interactive_rate, tier="interactive", max_tokens=20)
             for i in range(n)]
    sim = _run(reqs)
    assert len(sim.outcomes) == len(reqs)
    assert all(o.answered_at is not None for o in sim.outcomes.values())
    assert all(o.done is not None and not o.shed for o in sim.outcomes.values())  # all served, none refused
    assert (sim.preempted > 0) is expect_preempted
    assert sim.queues.queued() == 0 and sum(sim.queues.running(t) for t in ("interactive", "batch")) == 0


def test_overload_answers_everyone_in_time_with_retry_after() -> None:
    reqs = [Req(rid=i, arrival=i * 0.002, tier=("interactive", "standard", "batch")[i % 3],
                plan=("free", "paid")[i % 2], tenant=f"t{i % 5}", max_tokens=40,
                deadline=(2.0, 5.0, 10.0)[i % 3]) for i in range(3000)]
    sim = _run(reqs, 60.0)
    shed = [o for o in sim.outcomes.values() if o.shed]
    assert shed and all(o.retry_after > 0 for o in shed)
    assert all(o.answered_at is not None and o.answered_at <= o.req.arrival + o.req.deadline
               for o in sim.outcomes.values())
    by_tier = {t: sum(1 for o in shed if o.req.tier == t) for t in ("interactive", "standard", "batch")}
    assert by_tier["batch"] > by_tier["interactive"]
