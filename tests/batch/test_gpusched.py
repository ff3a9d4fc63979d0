"""The node GPU scheduler: placement, gang drains, aging, failures and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.batch.gpusched import GpuScheduler, Launch, SchedulerConfig
from ferry.errors import ConfigError

MODELS = {"small": 1, "large": 8}


def sched(**kwargs: object) -> GpuScheduler:
    return GpuScheduler(SchedulerConfig(**kwargs), MODELS)  # type: ignore[arg-type]


def place_all(s: GpuScheduler, now: float, ready: dict[str, float], limit: int = 20) -> list[Launch]:
    out: list[Launch] = []
    while len(out) < limit and (launch := s.decide(now, ready)) is not None:
        out.append(launch)
    return out


def test_small_batches_take_the_lowest_free_gpus_one_each() -> None:
    s = sched()
    launches = place_all(s, 0.0, {"small": 0.0}, limit=3)
    assert [(x.gpus, x.branch) for x in launches] == [((0,), "fit"), ((1,), "fit"), ((2,), "fit")]


def test_gang_takes_all_eight_atomically_when_free() -> None:
    s = sched()
    launch = s.decide(0.0, {"large": 0.0})
    assert launch is not None and launch.gpus == tuple(range(8)) and launch.branch == "fit"
    assert s.decide(0.0, {"small": 0.0}) is None  # nothing left


@pytest.mark.parametrize(
    ("config", "now", "small_since", "expect"),
    [
        pytest.param({}, 0.1, 0.05, None, id="drain-blocks-young-small"),
        pytest.param({}, 0.3, 0.0, "aged", id="aged-small-older-than-gang-goes"),
        pytest.param({}, 0.3, 0.06, None, id="aged-small-newer-than-gang-waits"),
        pytest.param({"aging": False}, 5.0, 0.0, None, id="aging-off-small-starves"),
        pytest.param({"reserve": False}, 0.1, 0.05, "fit", id="greedy-small-goes"),
    ],
)
def test_a_waiting_gang_holds_the_node(config: dict[str, object], now: float, small_since: float,
                                       expect: str | None) -> None:
    s = sched(**config)
    first = s.decide(0.0, {"small": 0.0})
    assert first is not None
    launch = s.decide(now, {"small": small_since, "large": 0.05})
    assert (launch.branch if launch else None) == expect
    if config.get("reserve", True):
        assert s.holder == "large"


def test_gang_launches_after_the_drain_and_counts_idle_gpu_seconds() -> None:
    s = sched()
    running = place_all(s, 0.0, {"small": 0.0}, limit=2)  # GPUs 0 and 1 busy
    assert s.decide(0.01, {"small": 0.01, "large": 0.0}) is None
    s.finish(running[0].batch_id, 0.05)
    assert s.decide(0.05, {"small": 0.05, "large": 0.0}) is None
    s.finish(running[1].batch_id, 0.1)
    launch = s.decide(0.1, {"small": 0.1, "large": 0.0})
    assert launch is not None and launch.model == "large" and launch.branch == "drained"
    assert s.holder is None
    # 6 free GPUs for 0.01..0.05, 7 for 0.05..0.1
    assert s.drain_idle_gpu_s == pytest.approx(6 * 0.04 + 7 * 0.05)


def test_a_failed_gpu_gets_no_work_and_the_gang_model_becomes_unavailable() -> None:
    s = sched()
    launch = s.decide(0.0, {"small": 0.0})
    assert launch is not None and launch.gpus == (0,)
    aborted = s.fail_gpu(0, 0.01)
    assert aborted == launch
    assert not s.available("large") and "7 of 8 healthy" in s.unavailable()["large"]
    assert s.available("small")
    placed = place_all(s, 0.02, {"small": 0.0, "large": 0.0})
    assert len(placed) == 7 and all(0 not in x.gpus and x.model == "small" for x in placed)
    assert s.restore_gpu(0, 0.03) and s.available("large")
    assert s.invariants() == []


def test_failing_a_gpu_under_a_gang_frees_the_others() -> None:
    s = sched()
    launch = s.decide(0.0, {"large": 0.0})
    assert launch is not None
    assert s.fail_gpu(3, 0.05) == launch
    assert s.free_gpus == (0, 1, 2, 4, 5, 6, 7) and s.failed_gpus == (3,)
    assert s.fail_gpu(3, 0.06) is None


@pytest.mark.parametrize(
    ("models", "config"),
    [
        pytest.param({"x": 9}, {}, id="gang-wider-than-node"),
        pytest.param({"x": 0}, {}, id="zero-gpus"),
        pytest.param({"x": 1}, {"gpus": 0}, id="empty-node"),
    ],
)
def test_bad_config_is_refused(models: dict[str, int], config: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GpuScheduler(SchedulerConfig(**config), models)  # type: ignore[arg-type]


def longest_small_wait(aging: bool, horizon: float = 3.0) -> float:
    """A large batch is due every moment (each one fresh), a small one since t=0: when does the small start?"""
    s = sched(aging=aging, age_limit_s=0.2)
    now, running = 0.0, None
    launch: Launch | None
    while now < horizon:
        ready = {"small": 0.0, "large": now - 0.05}
        while (launch := s.decide(now, ready)) is not None:
            if launch.model == "small":
                return now
            running = launch
        wake = s.wake_at(now, ready)
        nxt = now + 0.1 if running else now + 0.01
        now = min(nxt, wake) if wake is not None else nxt
        if running is not None and now >= running.started + 0.1:
            s.finish(running.batch_id, now)
            running = None
    return float("inf")


def longest_gang_wait(reserve: bool, horizon: float = 4.0) -> float:
    """One small batch comes due every 12.5 ms (the node stays busy, staggered); a large one from t=1: its wait."""
    s = sched(reserve=reserve)
    running: dict[int, Launch] = {}
    small_due = 0
    for tick in range(int(horizon / 0.0125)):
        now = tick * 0.0125
        for bid, job in list(running.items()):
            if now >= job.started + 0.1 - 1e-9:
                s.finish(bid, now)
                del running[bid]
        small_due += 1
        ready = {"small": now - 0.001}
        if now >= 1.0:
            ready["large"] = 1.0
        while (launch := s.decide(now, ready)) is not None:
            if launch.model == "large":
                return now - 1.0
            running[launch.batch_id] = launch
            small_due -= 1
            if not small_due:
                del ready["small"]
    return float("inf")


@pytest.mark.parametrize(
    ("aging", "bound"),
    [pytest.param(True, 0.2 + 0.1 + 1e-6, id="aging-bounds-small-wait"),
     pytest.param(False, float("inf"), id="no-aging-small-starves")],
)
def test_aging_bounds_the_small_wait(aging: bool, bound: float) -> None:
    wait = longest_small_wait(aging)
    assert wait <= bound if aging else wait == bound


@pytest.mark.parametrize(
    ("reserve", "bound"),
    [pytest.param(True, 0.1 + 1e-6, id="drain-bounds-gang-wait"),
     pytest.param(False, float("inf"), id="greedy-gang-starves")],
)
def test_the_drain_bounds_the_gang_wait(reserve: bool, bound: float) -> None:
    wait = longest_gang_wait(reserve)
    assert wait <= bound if reserve else wait == bound


event = st.one_of(
    st.tuples(st.just("decide"), st.floats(0, 0.5), st.one_of(st.none(), st.floats(0, 0.5))),
    st.tuples(st.just("finish"), st.integers(0, 7), st.none()),
    st.tuples(st.just("fail"), st.integers(0, 7), st.none()),
    st.tuples(st.just("restore"), st.integers(0, 7), st.none()),
    st.tuples(st.just("tick"), st.floats(0.001, 0.3), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=60), st.booleans(), st.booleans())
def test_invariants_hold_under_any_events(events: list[tuple[str, float, float | None]], aging: bool,
                                          reserve: bool) -> None:
    s = sched(aging=aging, reserve=reserve, age_limit_s=0.2)
    now = 1.0
    for kind, a, b in events:
        if kind == "tick":
            now += a
        elif kind == "finish" and s.running:
            s.finish(sorted(s.running)[int(a) % len(s.running)], now)
        elif kind == "fail":
            s.fail_gpu(int(a), now)
        elif kind == "restore":
            s.restore_gpu(int(a), now)
        elif kind == "decide":
            ready = {"small": now - a} if b is None else {"small": now - a, "large": now - b}
            while True:
                gang_due = reserve and "large" in ready and s.available("large")
                failed = set(s.failed_gpus)
                launch = s.decide(now, ready)
                if launch is None:
                    break
                assert not failed & set(launch.gpus), "a failed GPU got work"
                assert len(launch.gpus) == MODELS[launch.model], "a batch was partially placed"
                if launch.model == "small" and gang_due:
                    assert launch.branch == "aged" and aging, "a small batch started while a gang waited"
                    assert ready["small"] + 0.2 <= now and ready["small"] <= ready["large"]
        assert s.invariants() == []
        assert sum(len(x.gpus) for x in s.running.values()) <= 8
