"""A proxy's router config: the live keys laid over its file, refused naming the key, swapped without losing state."""

from __future__ import annotations

import dataclasses
import random

import pytest
from prometheus_client import CollectorRegistry

from dataplane.config import ProxySettings, _owners
from dataplane.pick.p2c import Branch
from dataplane.pick.state import PickState
from dataplane.routerconfig import RouterConfigs, overlay, settings_for
from dataplane.server import Proxy
from dataplane.table.local import build_table
from ferry.errors import ConfigError
from ferry.routerconfig import LIVE_KEYS, digest
from ferry.v1 import tables_pb2
from tests.dataplane.conftest import TENANTS
from tests.dataplane.fakes import route, snapshot


def test_every_live_key_is_a_proxy_key() -> None:
    assert set(_owners()) >= LIVE_KEYS


def test_a_text_over_the_file() -> None:
    base = ProxySettings.from_section({"walk_limit": 6, "queue_timeouts": [1.0, 5.0, 30.0]})
    settings = settings_for(base, "[proxy]\ndetour_factor = 0.0\nqueue_timeouts = [3.0, 6.0, 9.0]\n")
    assert settings.pick.walk_limit == 6 and settings.pick.detour_factor == 0.0
    assert settings.queues.queue_timeouts == (3.0, 6.0, 9.0)
    assert settings.http == base.http


@pytest.mark.parametrize(("text", "key"), [
    ("[proxy]\nwalk_limit = 0\n", "proxy.walk_limit"),
    ('[proxy]\nwalk_limit = "x"\n', "proxy.walk_limit"),
    ("[proxy]\nadmission_capacity_share = 2.0\n", "proxy.admission_capacity_share"),
    ('[proxy]\nretry_tiers = ["gold"]\n', "proxy.retry_tiers"),
    ("[proxy]\nmax_inflight = 5\n", "proxy.max_inflight"),
])
def test_a_bad_value_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_for(ProxySettings(), text)
    assert caught.value.key == key


def test_overlay_keeps_what_it_does_not_name() -> None:
    base = ProxySettings.from_section({"proxy_id": "p1", "region": "eu", "placements": 1000})
    assert overlay(base, {}) == base
    assert overlay(base, {"walk_limit": 2}).pick.placements == 1000


def _table(version: int = 1) -> object:
    return build_table(snapshot(version, [route(f"r{i}", f"h:{i + 1}") for i in range(4)]), region="local",
                       applied_at=0.0)


def test_the_picker_keeps_its_state_across_a_reconfigure() -> None:
    settings = ProxySettings()
    picker = PickState.from_settings(settings.pick, random.Random(1), outliers=settings.outliers,
                                  retries=settings.retries)
    table = _table()
    view = picker.apply_table(table)  # type: ignore[arg-type]
    routing = picker.prepare(table, tenant="t", model="m", version="", prompt_tokens=100,  # type: ignore[arg-type]
                             max_tokens=10, hashes=[1, 2])
    attempt = picker.sent("r1", routing, Branch.PLACED, now=1.0)
    picker.outliers.failed("r2", "m", now=1.0, pool_size=4)
    picker.budget.note_request(1.0)
    new = settings_for(settings, "[proxy]\nwalk_limit = 1\ndetour_factor = 0.0\noutlier_consecutive_failures = 2\n"
                                 "retry_budget_ratio = 0.5\n")
    picker.reconfigure(new.pick, regions=new.regions, capacity_share=0.5, outliers=new.outliers,
                       retries=new.retries)
    assert picker.params.walk_limit == 1 and picker.params.capacity_share == 0.5 and picker.detour_factor == 0.0
    assert picker.view is not None and picker.view.params.walk_limit == 1 and view.params.walk_limit == 8
    assert picker.local.prefill("r1") == 100  # the in-flight attempt is still counted
    assert picker.placements.get(routing.key) == "r1"  # type: ignore[arg-type]
    assert picker.outliers.params.consecutive_failures == 2
    assert picker.outliers.failed("r2", "m", now=1.1, pool_size=4) is not None  # its first failure was kept
    assert picker.budget.ratio == 0.5 and picker.budget.allowance(1.0) >= 100.5
    picker.first(attempt, 1.2)
    picker.done(attempt)
    assert picker.local.prefill("r1") == 0


class _Applied:
    def __init__(self) -> None:
        self.calls: list[ProxySettings] = []


def test_back_to_the_file_after_a_version() -> None:
    applied = _Applied()
    configs = RouterConfigs(ProxySettings(), applied.calls.append)
    text = "[proxy]\nwalk_limit = 3\n"
    table = tables_pb2.TableSnapshot(version=1)
    table.router_configs.add(version=1, text=text, digest=digest(text))
    table.router_assignments.add(proxy_id="p1", version=1)
    assert configs.follow(table, "p1") == (1, 0, "")
    bare = tables_pb2.TableSnapshot(version=2)  # rolled back: no assignment, default 0
    assert configs.follow(bare, "p1") == (0, 0, "") and applied.calls[-1] == ProxySettings()


def test_follow_applies_the_assigned_version_and_remembers_a_refusal() -> None:
    applied = _Applied()
    versions: list[int] = []
    configs = RouterConfigs(ProxySettings(), applied.calls.append, on_version=versions.append)
    good, bad = "[proxy]\nwalk_limit = 2\n", "[proxy]\nwalk_limit = 0\n"
    table = tables_pb2.TableSnapshot(version=1, router_default=1)
    table.router_configs.add(version=1, text=good, digest=digest(good))
    table.router_configs.add(version=2, text=bad, digest=digest(bad))
    assert configs.follow(table, "p1") == (1, 0, "")
    assert applied.calls[-1].pick.walk_limit == 2 and versions == [1]
    table.router_assignments.add(proxy_id="p1", version=2)
    running, refused, why = configs.follow(table, "p1")
    assert (running, refused) == (1, 2) and "proxy.walk_limit" in why
    assert configs.follow(table, "p1")[1] == 2 and len(applied.calls) == 1  # not parsed again
    assert configs.follow(table, "p2") == (1, 0, "")  # another proxy: the default
    del table.router_assignments[:]
    table.router_default = 0
    assert configs.follow(table, "p1") == (0, 0, "") and applied.calls[-1] == ProxySettings()


async def test_router_reconfigure_keeps_queues_and_inflight() -> None:
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p"}), tenants=TENANTS,
                  registry=CollectorRegistry(), rng=random.Random(3))
    router = proxy.router
    proxy.holder.apply(snapshot(1, [route(f"r{i}", f"h:{i + 1}") for i in range(2)]))
    queues = router.admission.models["m"]
    before = queues.capacity
    router.reconfigure(settings_for(router._settings, "[proxy]\nadmission_capacity_share = 0.5\n"
                                                      "queue_timeouts = [1.0, 2.0, 3.0]\nload_factor = 1.5\n"))
    assert router.admission.models["m"] is queues and queues.capacity == before // 2
    assert queues.params.timeouts["interactive"] == 1.0 and router.admission.params.timeouts["batch"] == 3.0
    assert router.picker.params.capacity_share == 0.5 and proxy.holder.params.load_factor == 1.5
    assert dataclasses.replace(router._settings.queues, admission_capacity_share=1.0,
                               queue_timeouts=(2.0, 10.0, 60.0)) == ProxySettings().queues
