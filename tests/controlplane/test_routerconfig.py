"""Router config rollouts, the pure parts: the sequential test, the assignment, the records, the text's keys."""

from __future__ import annotations

import math
import random

import pytest

from controlplane.routerconfig import guard as sprt
from controlplane.routerconfig.records import (
    CANARY,
    PROMOTED,
    RouterConfig,
    RouterRollout,
    assign,
    canaries,
    config_key,
    router_part,
)
from ferry.errors import ConfigError
from ferry.routerconfig import LIVE_KEYS, digest, parse
from ferry.tabledelta import apply_delta
from ferry.v1 import tables_pb2

MIN = 200  # the default guard's min_requests


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _window(rng: random.Random, scale: float, n: int = MIN, errors: float = 0.0) -> sprt.Group:
    """One group's window: ``n`` lognormal TTFTs (median 50 ms x ``scale``), reported by two proxies."""
    group = sprt.Group()
    for _ in range(2):
        values = [0.05 * scale * rng.lognormvariate(0.0, 0.5) for _ in range(n // 2)]
        failed = sum(rng.random() < errors for _ in values)
        group.add(len(values), failed, len(values), _p99(values), sorted(values)[len(values) // 2])
    return group


def _run(rng: random.Random, guard: sprt.Guard, canary_scale: float, windows: int,
         canary_errors: float = 0.0) -> tuple[str | None, int]:
    """The test over up to ``windows`` windows (one per window_seconds); (decision, windows taken)."""
    test = sprt.Test()
    for i in range(1, windows + 1):
        verdict = sprt.judge(guard, _window(rng, canary_scale, errors=canary_errors), _window(rng, 1.0))
        assert verdict is not None
        test.step(verdict)
        decision = sprt.decide(guard, test, i * guard.window_seconds)
        if decision is not None:
            return decision[0], i
    return None, windows


def test_identical_distributions_rarely_roll_back() -> None:
    rng, guard = random.Random(11), sprt.Guard(min_seconds=60.0, max_seconds=600.0)
    bad_share = sum(bool(sprt.judge(guard, _window(rng, 1.0), _window(rng, 1.0))) for _ in range(2000)) / 2000
    assert bad_share < sprt.P0  # the test's assumption under no harm holds at the default minimum
    outcomes = [_run(rng, guard, 1.0, 120)[0] for _ in range(300)]
    assert outcomes.count(sprt.ROLLBACK) <= 3  # the bound is 7.4 % (module docstring); far below it here
    assert outcomes.count(sprt.PROMOTE) >= 290


def test_a_canary_twice_as_slow_is_rolled_back_within_the_promised_windows() -> None:
    rng, guard = random.Random(12), sprt.Guard()
    for _ in range(200):
        decision, taken = _run(rng, guard, 2.0, 120)
        assert decision == sprt.ROLLBACK
        assert taken <= 6  # 4 when every window is bad (module docstring); a good one costs two more
    assert math.ceil(sprt.ROLLBACK_AT / sprt.BAD_STEP) == 4


def test_errors_are_compared_as_rates() -> None:
    rng, guard = random.Random(13), sprt.Guard()
    canary, baseline = _window(rng, 1.0), _window(rng, 1.0)
    canary.errors = 2  # 1 % of 200 against 0 %: beyond 0.5 points
    assert sprt.judge(guard, canary, baseline) is True
    assert _run(rng, guard, 1.0, 60, canary_errors=0.2)[0] == sprt.ROLLBACK
    lenient = sprt.Guard(error_increase_pp=10.0)
    assert sprt.judge(lenient, canary, baseline) is False


def test_a_window_without_enough_requests_does_not_count() -> None:
    guard = sprt.Guard(min_requests=50)
    rng = random.Random(14)
    assert sprt.judge(guard, _window(rng, 1.0, n=20), _window(rng, 1.0, n=200)) is None
    assert sprt.judge(guard, sprt.Group(), sprt.Group()) is None


def test_promotion_waits_for_min_seconds_and_undecided_rolls_back_at_max() -> None:
    guard = sprt.Guard(min_seconds=30.0, max_seconds=100.0, window_seconds=5.0)
    test = sprt.Test()
    for _ in range(5):
        test.step(False)
    assert test.llr == sprt.PROMOTE_AT  # held at the floor
    assert sprt.decide(guard, test, 25.0) is None
    assert sprt.decide(guard, test, 30.0)[0] == sprt.PROMOTE  # type: ignore[index]
    mixed = sprt.Test()
    for bad in (True, False) * 3:
        mixed.step(bad)
    assert sprt.decide(guard, mixed, 99.0) is None
    decision = sprt.decide(guard, mixed, 100.0)
    assert decision is not None and decision[0] == sprt.ROLLBACK and "undecided" in decision[1]


def test_the_guard_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="guard.ttft_p99_ratio"):
        sprt.Guard(ttft_p99_ratio=0.5).check()
    with pytest.raises(ValueError, match="guard.max_seconds"):
        sprt.Guard(min_seconds=10.0, max_seconds=5.0).check()


def test_assignment_shares_are_ceilings_and_deterministic() -> None:
    assert len(canaries(["p1", "p2"], 0.5)) == 1
    assert len(canaries([f"p{i}" for i in range(10)], 0.1)) == 1
    assert len(canaries([f"p{i}" for i in range(10)], 0.11)) == 2
    assert len(canaries([f"p{i}" for i in range(3)], 1.0)) == 3
    assert canaries([f"p{i}" for i in range(7)], 0.3) == canaries(reversed([f"p{i}" for i in range(7)]), 0.3)


def test_proxies_joining_and_leaving_move_few() -> None:
    ids = [f"proxy-{i}" for i in range(20)]
    before = set(canaries(ids, 0.25))
    after = set(canaries([*ids, "proxy-new"], 0.25))  # ceil(5.25) = 6: one more, the others stay
    assert len(before) == 5 and len(after) == 6 and len(before - after) <= 1
    gone = set(canaries([i for i in ids if i not in before], 0.25))
    assert len(gone) == math.ceil(0.25 * 15)


def _rollout(state: str = CANARY, share: float = 0.5) -> RouterRollout:
    return RouterRollout(id=3, baseline=1, candidate=2, share=share, guard=sprt.Guard(), state=state,
                         reason="started", started_at=10.0, updated_at=10.0)


def test_assign_only_in_canary_per_region() -> None:
    regions = {"eu": ["a", "b"], "us": ["c", "d", "e", "f"]}
    named = assign(_rollout(), regions)
    assert len(named["eu"]) == 1 and len(named["us"]) == 2
    assert assign(_rollout(PROMOTED), regions) == {"eu": [], "us": []}


def test_records_round_trip_and_refuse_bad_fields() -> None:
    record = _rollout()
    assert RouterRollout.decode(record.encode()) == record
    config = RouterConfig(2, "[proxy]\nwalk_limit = 2\n", digest("[proxy]\nwalk_limit = 2\n"), 5.0)
    assert RouterConfig.decode(config_key(2), config.encode()) == config
    with pytest.raises(ValueError, match="share"):
        RouterRollout.decode(record.encode().replace(b'"share": 0.5', b'"share": 2'))
    with pytest.raises(ValueError, match="version"):
        RouterConfig.decode(config_key(3), config.encode())


def test_the_table_part_and_its_delta() -> None:
    configs = {v: RouterConfig(v, f"[proxy]\nwalk_limit = {v}\n", digest(f"[proxy]\nwalk_limit = {v}\n"), 0.0)
               for v in (1, 2)}
    old = tables_pb2.TableSnapshot(version=5, region="eu")
    router_part(old, _rollout(), ["a"], configs)
    assert [c.version for c in old.router_configs] == [1, 2] and old.router_default == 1
    assert [(a.proxy_id, a.version) for a in old.router_assignments] == [("a", 2)]
    new = tables_pb2.TableSnapshot(version=6, region="eu")
    router_part(new, _rollout(PROMOTED), [], configs)
    assert [c.version for c in new.router_configs] == [2] and new.router_default == 2 and not new.router_assignments
    from controlplane.tables.delta import table_delta
    delta = table_delta(old, new)
    assert delta is not None and delta.delta.router_changed
    assert apply_delta(old, delta) == new
    same = tables_pb2.TableSnapshot(version=7, region="eu")
    same.CopyFrom(new)
    same.version = 7
    kept = table_delta(new, same)
    assert kept is not None and not kept.delta.router_changed and apply_delta(new, kept) == same


def test_a_text_holds_live_proxy_keys_only() -> None:
    assert parse("[proxy]\nwalk_limit = 1\ndetour_factor = 0.0\n") == {"walk_limit": 1, "detour_factor": 0.0}
    with pytest.raises(ConfigError, match=r"proxy\.http_listen: needs a restart"):
        parse('[proxy]\nhttp_listen = "127.0.0.1:9"\n')
    with pytest.raises(ConfigError, match=r"proxy\.placements: needs a restart"):
        parse("[proxy]\nplacements = 10\n")
    with pytest.raises(ConfigError, match="controlplane"):
        parse("[controlplane]\ntick_seconds = 1\n")
    with pytest.raises(ConfigError, match="router.text"):
        parse("[proxy\n")
    assert "admission_capacity_share" in LIVE_KEYS and "listen" not in LIVE_KEYS
