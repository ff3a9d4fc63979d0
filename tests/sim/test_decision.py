"""The simulator runs the proxy's whole decision: outlier ejection fed by simulated results, retries, refusals."""

from __future__ import annotations

import dataclasses
import random

from agent.replica.engine import EngineParams
from dataplane.config import ProxySettings
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES, Ferry
from tools.sim.workload import SimRequest

ENGINE = EngineParams(max_running=16, kv_blocks_total=1024, prefix_cache_blocks=1024)


def _mix(n: int, rate: float, seed: int = 1) -> list[SimRequest]:
    """Half long prompts with short answers (8-16 k tokens, 1-4 out), half short prompts with long answers."""
    rng = random.Random(seed)
    out, now = [], 0.0
    for i in range(n):
        now += rng.expovariate(rate)
        if i % 2:
            prompt, answer = rng.randint(8_000, 16_000), rng.randint(1, 4)
        else:
            prompt, answer = rng.randint(50, 400), rng.randint(100, 300)
        blocks = -(-prompt // 512)
        out.append(SimRequest(i, now, prompt, answer, tuple(range(10_000 * i, 10_000 * i + blocks))))
    return out


def _ejections(fleet: Fleet) -> list[tuple[float, str, str]]:
    return sorted(e for p in fleet.policies if isinstance(p, Ferry) for e in p.picker.outliers.history)


def test_healthy_replicas_serving_long_prompts_and_long_answers_are_never_ejected() -> None:
    fleet = Fleet(FleetConfig(replicas=8, proxies=2, engine=ENGINE), POLICIES["ferry"], _mix(3_000, 25.0))
    result = fleet.run()
    assert not any(s.rejected for s in result.served)
    assert _ejections(fleet) == []


def test_a_ten_times_slower_replica_is_ejected_within_10_s() -> None:
    slow = dataclasses.replace(ENGINE, **{f: getattr(ENGINE, f) * 10 for f in (
        "prefill_base_seconds", "prefill_seconds_per_token", "decode_base_seconds", "decode_seconds_per_request")})
    fleet = Fleet(FleetConfig(replicas=8, proxies=2, engine=ENGINE, engines={3: slow}), POLICIES["ferry"],
                  _mix(1_500, 25.0))
    fleet.run()
    ejections = _ejections(fleet)
    assert ejections and {rid for _, rid, _ in ejections} == {"r003"}
    assert ejections[0][0] < 10.0


def test_a_request_longer_than_every_context_is_refused_not_a_crash() -> None:
    requests = [SimRequest(0, 0.0, 200_000, 4, tuple(range(391))), SimRequest(1, 0.1, 100, 4, (1,))]
    result = Fleet(FleetConfig(replicas=2, proxies=1, engine=ENGINE), POLICIES["ferry"], requests).run()
    assert [s.rejected for s in result.served] == [True, False]
    assert result.served[0].branch == "too_long"


def test_the_proxy_tier_queue_holds_what_the_slots_cannot_take_and_refuses_past_its_timeout() -> None:
    """Two replicas of two slots: four start at once, the rest wait in the proxy's interactive queue; with a
    0.5 s queue timeout and answers of some 1.6 s, the others are refused (by their expected wait, or at the
    timeout), never sent and never lost."""
    settings = ProxySettings.from_section({"queue_timeouts": (0.5, 10.0, 60.0)})
    engine = EngineParams(max_running=2, kv_blocks_total=256, prefix_cache_blocks=256)
    requests = [SimRequest(i, 0.001 * i, 100, 200, (10_000 + i,)) for i in range(20)]
    fleet = Fleet(FleetConfig(replicas=2, proxies=1, engine=engine), lambda p, rng: Ferry(rng, settings), requests)
    result = fleet.run()
    started = [s for s in result.served if not s.rejected]
    assert len(started) == 4 and sum(s.rejected for s in result.served) == 16
    assert all(s.attempts == 0 for s in result.served if s.rejected)  # refused in the queue, never sent
    waited = Fleet(FleetConfig(replicas=2, proxies=1, engine=engine), lambda p, rng: Ferry(rng, settings),
                   [dataclasses.replace(r, max_tokens=20) for r in requests[:5]]).run()
    assert not any(s.rejected for s in waited.served)  # the fifth waits 0.17 s for a slot, within the timeout
    assert waited.served[4].ttft > 0.15
