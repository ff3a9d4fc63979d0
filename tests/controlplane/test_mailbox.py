"""controlplane.mailbox: bounded FIFO and keep-latest policies, close, next."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.mailbox import Mailbox


async def test_fifo_keeps_order_and_refuses_beyond_capacity() -> None:
    box: Mailbox[int] = Mailbox.fifo(2)
    assert box.offer(1) and box.offer(2)
    assert not box.offer(3)
    assert len(box) == 2
    assert await box.next() == 1
    assert box.offer(3)
    assert [await box.next(), await box.next()] == [2, 3]
    assert box.take() is None


async def test_latest_replaces_per_key_and_delivers_in_key_order() -> None:
    box: Mailbox[tuple[str, int]] = Mailbox.latest(key=lambda item: item[0])
    for item in (("us", 1), ("eu", 1), ("us", 2)):
        assert box.offer(item)
    assert len(box) == 2
    assert [await box.next(), await box.next()] == [("eu", 1), ("us", 2)]


async def test_latest_with_one_slot_keeps_only_the_newest() -> None:
    box: Mailbox[int] = Mailbox.latest()
    for i in range(5):
        box.offer(i)
    assert await box.next() == 4
    assert box.take() is None


async def test_next_waits_for_an_offer() -> None:
    box: Mailbox[str] = Mailbox.fifo(4)
    waiter = asyncio.ensure_future(box.next())
    await asyncio.sleep(0)
    assert not waiter.done()
    box.offer("a")
    assert await asyncio.wait_for(waiter, 1) == "a"


async def test_close_wakes_the_consumer_drops_items_and_refuses_offers() -> None:
    box: Mailbox[int] = Mailbox.fifo(4)
    waiter = asyncio.ensure_future(box.next())
    await asyncio.sleep(0)
    box.close("first")
    box.close("second")
    assert await asyncio.wait_for(waiter, 1) is None
    assert box.closed and box.closed_reason == "first"
    assert not box.offer(1)
    assert await box.next() is None

    latest: Mailbox[int] = Mailbox.latest()
    latest.offer(1)
    latest.close("done")
    assert await latest.next() is None and len(latest) == 0


def test_a_policy_must_be_chosen_once() -> None:
    with pytest.raises(ValueError):
        Mailbox()
    with pytest.raises(ValueError):
        Mailbox(capacity=1, key=str)
    with pytest.raises(ValueError):
        Mailbox.fifo(0)
