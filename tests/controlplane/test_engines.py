"""The engine fit (pure), its windows, the service's intake and relay, and ``fitted_params``: table by table."""

from __future__ import annotations

import math
import random

import pytest

from agent.replica.engine import EngineParams
from controlplane.engines.fit import PARAMS, Interval, fit_steps, nnls
from controlplane.engines.window import EngineWindows, Facts, Kind, Sample
from controlplane.fleet.view import Member
from controlplane.services.engines import EngineService
from ferry.errors import InvalidArgument
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2
from ferry_cli.ctl.engines import fitted_params, row

TRUE = {"prefill_base_seconds": 0.003, "prefill_seconds_per_token": 25e-6, "decode_base_seconds": 0.009,
        "decode_seconds_per_request": 0.0004}


def interval(sp: float, p: float, sd: float, d: float, *, noise: float = 0.0, rng: random.Random | None = None,
             true: dict[str, float] = TRUE) -> Interval:
    """An interval's counts and its step time under ``true``, plus noise: ``noise`` seconds (standard deviation)
    of lateness and as much again in parts per hundred of the time (a host's scheduling)."""
    t = (true["prefill_base_seconds"] * sp + true["prefill_seconds_per_token"] * p
         + true["decode_base_seconds"] * sd + true["decode_seconds_per_request"] * d)
    if noise and rng is not None:
        t = max(0.0, t * (1 + rng.gauss(0, noise)) + rng.gauss(0, noise))
    return Interval(prefill_steps=sp, prefill_tokens=p, decode_steps=sd, decode_tokens=d, step_seconds=t)


def varied(n: int, rng: random.Random, *, noise: float = 0.002, prefill: bool = True, decode: bool = True,
           true: dict[str, float] = TRUE) -> list[Interval]:
    """Intervals like a busy replica's over half a second: a varying number of prefill and decode steps, tokens
    per prefill step (short and long prompts) and batch sizes."""
    out = []
    for _ in range(n):
        sp = rng.randint(0, 20) if prefill else 0
        p = sp * rng.choice((rng.randint(1, 100), rng.randint(1, 2000))) if sp else 0
        sd = rng.randint(0, 40) if decode else 0
        d = sd * rng.randint(1, 60) if sd else 0
        out.append(interval(sp, p, sd, d, noise=noise, rng=rng, true=true))
    return out


def test_known_parameters_come_back_within_two_percent_through_noise() -> None:
    fit = fit_steps(varied(500, random.Random(1)))
    assert fit.samples <= 500 and fit.samples > 450
    for name in PARAMS:
        p = fit.param(name)
        assert p.value == pytest.approx(TRUE[name], rel=0.02), name
        assert p.stderr is not None and 0 < p.stderr < 0.02 * TRUE[name]
    assert fit.relative_rms is not None and 0.001 < fit.relative_rms < 0.02  # the noise
    assert fit.r2 is not None and fit.r2 > 0.99


def test_exact_samples_give_the_parameters_exactly() -> None:
    fit = fit_steps(varied(50, random.Random(2), noise=0.0))
    assert fit.values() == pytest.approx(TRUE, rel=1e-9)
    assert fit.relative_rms == pytest.approx(0.0, abs=1e-12) and fit.r2 == pytest.approx(1.0)


def test_no_sample_and_idle_intervals_identify_nothing() -> None:
    for rows in ([], [interval(0, 0, 0, 0)] * 5):
        fit = fit_steps(rows)
        assert fit.samples == 0 and fit.values() == {}
        assert {p.reason for p in fit.params} == {"no samples"}
        assert fit.relative_rms is None and fit.r2 is None


def test_no_step_prefilled_names_both_prefill_parameters_and_fits_the_decode_ones() -> None:
    fit = fit_steps(varied(200, random.Random(3), prefill=False))
    assert [(p.name, p.reason) for p in fit.params if not p.identifiable] == [
        ("prefill_base_seconds", "no step prefilled"), ("prefill_seconds_per_token", "no step prefilled")]
    assert fit.values() == pytest.approx({k: TRUE[k] for k in PARAMS[2:]}, rel=0.02)


def test_no_step_decoded_names_both_decode_parameters() -> None:
    fit = fit_steps(varied(200, random.Random(4), decode=False))
    assert {p.name: p.reason for p in fit.params if not p.identifiable} == {
        "decode_base_seconds": "no step decoded", "decode_seconds_per_request": "no step decoded"}
    assert fit.values() == pytest.approx({k: TRUE[k] for k in PARAMS[:2]}, rel=0.02)


def test_only_cached_prompts_leave_the_per_token_cost_unknown() -> None:
    rng = random.Random(5)
    rows = [interval(sp, 0, sd, sd * rng.randint(1, 30)) for sp, sd in
            ((rng.randint(1, 10), rng.randint(1, 30)) for _ in range(100))]
    fit = fit_steps(rows)
    assert fit.param("prefill_seconds_per_token").reason == "no token prefilled (only fully cached prompts)"
    assert fit.param("prefill_base_seconds").value == pytest.approx(TRUE["prefill_base_seconds"], rel=1e-6)


def test_columns_in_a_fixed_proportion_are_named_and_the_others_stay_unbiased() -> None:
    rng = random.Random(6)  # every prefill step prefills exactly 512 tokens: base and per-token cannot be told apart
    rows = [interval(sp, 512 * sp, sd, sd * rng.randint(1, 30)) for sp, sd in
            ((rng.randint(1, 10), rng.randint(1, 30)) for _ in range(100))]
    fit = fit_steps(rows)
    reasons = {p.name: p.reason for p in fit.params if not p.identifiable}
    assert set(reasons) == {"prefill_base_seconds", "prefill_seconds_per_token"}
    assert "in a fixed proportion to tokens prefilled" in reasons["prefill_base_seconds"]
    assert fit.values() == pytest.approx({k: TRUE[k] for k in PARAMS[2:]}, rel=1e-6)
    assert fit.relative_rms == pytest.approx(0.0, abs=1e-9)


def test_fewer_samples_than_parameters_are_not_a_fit() -> None:
    fit = fit_steps([interval(2, 300, 3, 9)])
    assert fit.samples == 1 and fit.values() == {}  # one row: every direction but one is unknown
    assert all(p.reason for p in fit.params)


def test_a_parameter_that_is_zero_is_held_at_zero_not_negative() -> None:
    true = {**TRUE, "decode_seconds_per_request": 0.0}
    fit = fit_steps(varied(300, random.Random(7), noise=0.005, true=true))
    p = fit.param("decode_seconds_per_request")
    assert p.value is not None and 0.0 <= p.value < 2e-5
    assert all((q.value or 0) >= 0 for q in fit.params)


def test_nnls_matches_least_squares_inside_and_clamps_at_the_bound() -> None:
    rng = random.Random(8)
    a = [[rng.random() for _ in range(3)] for _ in range(40)]
    import numpy as np
    am = np.array(a)
    b = am @ np.array([1.0, 2.0, 3.0])
    assert nnls(am, b) == pytest.approx([1.0, 2.0, 3.0])
    b = am @ np.array([1.0, -2.0, 3.0])
    x = nnls(am, b)
    assert x[1] == 0.0 and all(x >= 0)


# -- windows


def sample(at: float, rid: str = "r0", facts: Facts | None = None) -> Sample:
    return Sample(at=at, replica_id=rid, interval=interval(1, 100, 2, 10), facts=facts or Facts())


KIND = Kind(engine="simulated", gpus=1, version="v1")


def test_a_window_keeps_the_last_samples_and_drops_old_ones() -> None:
    w = EngineWindows(max_samples=3, max_age_seconds=10.0, max_kinds=2)
    for t in range(5):
        assert w.add("m", KIND, sample(float(t), rid=f"r{t}"))
    (fit,) = w.fits(now=5.0)
    assert fit.replica_ids == ("r2", "r3", "r4") and fit.fit.samples == 3 and fit.window_seconds == 2.0
    assert w.fits(now=13.5)[0].replica_ids == ("r4",)  # older than 10 s: gone
    assert w.fits(now=100.0) == [] and len(w) == 0  # a key left without samples goes too


def test_windows_refuse_a_key_past_the_bound_and_count_it() -> None:
    w = EngineWindows(max_samples=3, max_age_seconds=10.0, max_kinds=2)
    assert w.add("a", KIND, sample(0.0)) and w.add("b", KIND, sample(0.0))
    assert not w.add("c", KIND, sample(1.0)) and w.dropped == 1
    assert w.add("a", KIND, sample(1.0))  # a known key still takes samples
    assert w.add("c", KIND, sample(20.0))  # once the others expired, there is room
    assert [f.model for f in w.fits(now=20.0)] == ["c"]
    with pytest.raises(ValueError):
        EngineWindows(max_samples=0)


def test_the_facts_are_those_most_samples_state() -> None:
    w = EngineWindows()
    a = Facts(kv_blocks_total=100, kv_block_tokens=16, max_running=8, max_step_tokens=512)
    b = Facts(kv_blocks_total=200, kv_block_tokens=16, max_running=0, unchunked=True)
    for f in (a, a, b):
        w.add("m", KIND, sample(0.0, facts=f))
    (fit,) = w.fits(now=0.0)
    assert fit.facts == a
    w2 = EngineWindows()
    for f in (b, b, a):
        w2.add("m", KIND, sample(0.0, facts=f))
    facts = w2.fits(now=0.0)[0].facts
    assert (facts.kv_blocks_total, facts.max_running, facts.max_step_tokens, facts.unchunked) == (200, 8, 0, True)


# -- the service


def info(rid: str, model: str = "chat", engine: str = "simulated") -> fleet_pb2.ReplicaInfo:
    return fleet_pb2.ReplicaInfo(replica_id=rid, model=model, version="v1", gpus=1, engine=engine)


def engine_sample(**kw: float) -> common_pb2.EngineSample:
    fields = {"prefill_steps": 2, "prefill_tokens": 300, "decode_steps": 5, "decode_tokens": 20,
              "step_seconds": 0.1, "intervals": 1, "kv_blocks_total": 64, "max_running": 8, "max_step_tokens": 256}
    fields.update(kw)
    return common_pb2.EngineSample(**fields)  # type: ignore[arg-type]


def telemetry(*samples: tuple[str, common_pb2.EngineSample | None]) -> fleet_pb2.Telemetry:
    return fleet_pb2.Telemetry(seq=1, replicas=[common_pb2.ReplicaLoad(replica_id=rid, engine=s) for rid, s in samples])


def service(relaying: bool = False, **kw: object) -> EngineService:
    return EngineService(clock=lambda: 100.0, wall=lambda: 1e9, relaying=lambda: relaying, **kw)  # type: ignore[arg-type]


def test_take_checks_and_strips_the_samples_out_of_the_loads() -> None:
    svc = service()
    msg = telemetry(("r0", engine_sample()), ("r1", None))
    taken = svc.take(msg)
    assert [s.replica_id for s in taken] == ["r0"] and taken[0].prefill_tokens == 300
    assert not any(load.HasField("engine") for load in msg.replicas)  # never reaches the view or the tables
    for bad, field in ((engine_sample(step_seconds=float("nan")), "step_seconds"),
                       (engine_sample(step_seconds=-1.0), "step_seconds"),
                       (engine_sample(decode_tokens=1 << 50), "decode_tokens")):
        msg = telemetry(("r0", engine_sample()), ("r1", bad))
        with pytest.raises(InvalidArgument) as caught:
            svc.take(msg)
        assert caught.value.field == f"telemetry.replicas[1].engine.{field}"
        assert msg.replicas[0].HasField("engine")  # refused whole: nothing taken


def test_record_files_samples_by_model_and_kind_and_drops_unknown_replicas() -> None:
    svc = service()
    replicas = {"r0": info("r0"), "r1": info("r1", engine="vllm")}
    svc.record("n1", replicas, [engine_sample(replica_id="r0"), engine_sample(replica_id="r1"),
                                engine_sample(replica_id="gone"),
                                engine_sample(replica_id="r0", prefill_steps=0, decode_steps=0)])  # idle: skipped
    views = svc.engines().engines
    assert [(v.model, v.kind, v.samples, list(v.replica_ids)) for v in views] == [
        ("chat", "simulated/1gpu/v1", 1, ["r0"]), ("chat", "vllm/1gpu/v1", 1, ["r1"])]
    assert svc.engines().samples_dropped == 1
    assert svc.relay() == {}  # not following: nothing kept for a leader


def test_a_follower_relays_one_summed_sample_per_replica_then_starts_again() -> None:
    svc = service(relaying=True, max_relayed=2)
    replicas = {r: info(r) for r in ("r0", "r1", "r2")}
    svc.record("n1", replicas, [engine_sample(replica_id="r0"), engine_sample(replica_id="r1")])
    svc.record("n1", replicas, [engine_sample(replica_id="r0", step_seconds=0.3, max_running=9),
                                engine_sample(replica_id="r2")])  # a third replica: past the relay's bound
    relayed = svc.relay()
    (r0, r1) = relayed["n1"]
    assert (r0.replica_id, r0.prefill_steps, r0.decode_tokens, r0.intervals, r0.max_running) == ("r0", 4, 40, 2, 9)
    assert r0.step_seconds == pytest.approx(0.4) and r1.replica_id == "r1"
    assert svc.dropped == 1 and svc.relay() == {}
    leader = service()
    leader.record("n1", replicas, relayed["n1"], relay=False)
    assert leader.engines().engines[0].samples == 2


def test_check_report_names_the_relayed_field() -> None:
    report = admin_pb2.FollowerReport(control_plane_id="cp2", members=[
        admin_pb2.MemberReport(node="n1", engine_samples=[engine_sample(), engine_sample(step_seconds=1e9)])])
    with pytest.raises(InvalidArgument) as caught:
        service().check_report(report)
    assert caught.value.field == "report.members[0].engine_samples[1].step_seconds"


def test_live_replicas_without_samples_are_listed_as_no_samples() -> None:
    member = Member(node="n1", region="r", gpus=1, agent_version="", session=1, registered_at=100.0,
                    last_heard=100.0, replicas={"r0": info("r0"), "b0": info("b0", model="big")})
    svc = service(members=lambda: [member])
    svc.record("n1", member.replicas, [engine_sample(replica_id="r0")])
    views = {v.model: v for v in svc.engines().engines}
    assert views["big"].samples == 0 and list(views["big"].replica_ids) == ["b0"]
    assert {p.reason for p in views["big"].params} == {"no samples"}
    assert math.isnan(views["big"].relative_rms)
    assert [v.model for v in svc.engines("big").engines] == ["big"]


# -- the JSON row and fitted_params


def test_a_row_builds_the_engine_params_the_replicas_run() -> None:
    w = EngineWindows()
    rng = random.Random(9)
    facts = Facts(kv_blocks_total=3000, kv_block_tokens=64, max_running=12, max_step_tokens=1536)
    for i, iv in enumerate(varied(100, rng, noise=0.0)):
        w.add("chat", KIND, Sample(at=float(i), replica_id="r0", interval=iv, facts=facts))
    from controlplane.services.engines import engine_view
    r = row(engine_view(w.fits(now=100.0)[0]))
    assert set(r) >= {"model", "kind", "replicas", "samples", "params", "stderr", "fit"}
    params = EngineParams(**r["params"])  # the field names are EngineParams'
    assert params == fitted_params(r)
    assert {k: getattr(params, k) for k in PARAMS} == pytest.approx(TRUE, rel=1e-9)
    assert (params.kv_blocks_total, params.kv_block_tokens, params.max_running, params.max_step_tokens) == (
        3000, 64, 12, 1536)
    base = EngineParams(max_queue=7, answer_tokens=48)
    assert fitted_params(r, base).max_queue == 7 and fitted_params(r, base).answer_tokens == 48
    r["params"]["max_step_tokens"] = 0  # an engine without a step limit
    assert fitted_params(r).max_step_tokens == 0
    assert fitted_params({"params": {}}) == EngineParams()  # nothing known: the defaults
