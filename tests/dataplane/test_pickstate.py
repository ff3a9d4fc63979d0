"""The per-proxy pick state: keys and versions per request, prefill backlog bookkeeping, learned reuse."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dataplane.pick.p2c import Branch
from dataplane.pick.state import PickState, Reuse
from dataplane.table.local import build_table
from ferry.v1 import tables_pb2
from tests.dataplane.fakes import route, snapshot


def canary_table() -> Any:
    routes = [route(f"a{i}", f"h:{i + 1}", version="v1") for i in range(3)]
    routes += [route(f"b{i}", f"h:{i + 11}", version="v2") for i in range(3)]
    snap = snapshot(1, routes)
    snap.models[0].version_weights.extend([tables_pb2.VersionWeight(version="v1", weight=1.0),
                                           tables_pb2.VersionWeight(version="v2", weight=1.0)])
    return build_table(snap, region="local", applied_at=0.0)


def prepare(picker: PickState, table: Any, hashes: list[int], **kw: Any) -> Any:
    return picker.prepare(table, tenant="t", model="m", version="", prompt_tokens=100, max_tokens=10,
                          hashes=hashes, **kw)


def test_a_conversation_keeps_its_canary_version() -> None:
    table, picker = canary_table(), PickState(random.Random(1))
    for conv in range(20):
        versions = {prepare(picker, table, [7, 100 + conv, 200 + conv + turn]).version for turn in range(5)}
        assert len(versions) == 1
    both = {prepare(picker, table, [7, 100 + conv]).version for conv in range(40)}
    assert both == {"v1", "v2"}


def test_the_shared_first_block_is_skipped_once_hot() -> None:
    table, picker = build_table(snapshot(1, [route(f"r{i}", f"h:{i + 1}") for i in range(4)]), region="local",
                                applied_at=0.0), PickState(random.Random(1))
    first = [prepare(picker, table, [7, 100 + i]) for i in range(40)]
    keys = picker.keys("t", "", [7, 140])
    late = prepare(picker, table, [7, 140])
    assert late.key == keys[1]           # routed by its second block
    assert first[0].key == keys[0]       # at the start block 0 was not yet known to be hot
    only_hot = prepare(picker, table, [7])
    assert only_hot.key is None and only_hot.hot
    assert prepare(picker, table, [], prefix_key="").key is None and not prepare(picker, table, []).hot


BOOKS = [
    # id, first token seen, expected backlog after sent, after first, after done
    ("stream", True, 100, 0, 0),
    ("unary-counts-until-done", False, 100, 100, 0),
]


@pytest.mark.parametrize(("first", "after_sent", "after_first", "after_done"), [b[1:] for b in BOOKS],
                         ids=[b[0] for b in BOOKS])
def test_prefill_backlog_bookkeeping(first: bool, after_sent: int, after_first: int, after_done: int) -> None:
    table = build_table(snapshot(1, [route("r1", "h:1"), route("r2", "h:2")]), region="local", applied_at=0.0)
    picker = PickState(random.Random(1))
    routing = prepare(picker, table, [1, 2])
    attempt = picker.sent("r1", routing, Branch.AFFINITY)
    assert picker.local.prefill("r1") == after_sent and picker.local.get("r1") == 1
    if first:
        picker.first(attempt)
        picker.first(attempt)  # a second piece changes nothing
    assert picker.local.prefill("r1") == after_first
    picker.done(attempt, 40)
    assert picker.local.prefill("r1") == after_done and picker.local.get("r1") == 0 and len(picker.local) == 0


def test_reuse_learns_what_the_prefix_replica_saves() -> None:
    reuse = Reuse(rate=0.1)
    assert reuse.advantage() == pytest.approx(0.5)  # the prior, before any report
    for _ in range(200):
        reuse.learn(True, 600, 1000)   # 60 % cached at the prefix's replica
        reuse.learn(False, 100, 1000)  # 10 % anywhere
        reuse.prompt(1000)
    assert reuse.advantage() == pytest.approx(0.5, abs=0.01)
    for _ in range(200):
        reuse.learn(True, 120, 1000)   # the prefix's replica no longer saves much
    assert reuse.advantage() == pytest.approx(0.02, abs=0.01)
    assert reuse.mean_prompt == pytest.approx(1000)


def test_detour_threshold_follows_the_learned_advantage() -> None:
    picker = PickState(random.Random(1), detour_factor=12.0)
    table = build_table(snapshot(1, [route("r1", "h:1")]), region="local", applied_at=0.0)
    for _ in range(300):
        routing = prepare(picker, table, [1, 2])
        attempt = picker.sent("r1", routing, Branch.AFFINITY)  # the key is remembered from here on
        picker.done(attempt, 50)                      # half of each 100-token prompt cached back home
        other = picker.sent("r1", routing, Branch.P2C)
        picker.done(other, 0)                          # nothing elsewhere
        detoured = picker.sent("r1", routing, Branch.DETOUR)
        picker.done(detoured, 100)                     # detours are not counted either way
    assert picker.detour() == pytest.approx(0.5 * 12 * 100, rel=0.05)


def test_a_new_key_is_not_learned_as_going_home() -> None:
    picker = PickState(random.Random(1))
    table = build_table(snapshot(1, [route("r1", "h:1")]), region="local", applied_at=0.0)
    before = picker.reuse.advantage()
    for conv in range(50):
        attempt = picker.sent("r1", prepare(picker, table, [1000 + conv]), Branch.AFFINITY)  # each key new
        assert not attempt.known
        picker.done(attempt, 0)
    assert picker.reuse.advantage() == before
