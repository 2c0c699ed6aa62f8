"""The byte budget: FIFO backpressure that survives cancellation."""

from __future__ import annotations

import asyncio

import pytest

from aioloader.reads.staging import ByteBudget


async def test_waits_until_released() -> None:
    budget = ByteBudget(100)
    await budget.acquire(60)
    waiter = asyncio.create_task(budget.acquire(60))
    await asyncio.sleep(0)
    assert not waiter.done() and budget.statistics().waiting == 1
    budget.release(60)
    await waiter
    assert budget.statistics().used == 60
    budget.release(60)
    assert budget.statistics().used == 0 and budget.statistics().peak == 60


async def test_fifo_order() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    order: list[int] = []

    async def take(i: int, n: int) -> None:
        await budget.acquire(n)
        order.append(i)

    tasks = [asyncio.create_task(take(i, n)) for i, n in enumerate([8, 1, 1])]
    await asyncio.sleep(0)
    budget.release(10)
    await asyncio.gather(*tasks)
    # The small requests did not jump the queue ahead of the big one.
    assert order == [0, 1, 2]


async def test_cancelled_waiter_leaves_no_trace() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    big = asyncio.create_task(budget.acquire(10))
    small = asyncio.create_task(budget.acquire(1))
    await asyncio.sleep(0)
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    budget.release(10)
    await small  # no longer stuck behind the cancelled one
    assert budget.statistics().used == 1 and budget.statistics().waiting == 0


async def test_cancelled_after_grant_gives_it_back() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    waiter = asyncio.create_task(budget.acquire(5))
    await asyncio.sleep(0)
    budget.release(10)  # grants 5 to the waiter synchronously...
    waiter.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert budget.statistics().used == 0


def test_nowait_and_bounds() -> None:
    budget = ByteBudget(10)
    assert budget.acquire_nowait(10)
    assert not budget.acquire_nowait(1)
    with pytest.raises(ValueError):
        budget.acquire_nowait(11)
    with pytest.raises(RuntimeError):
        budget.release(11)
    budget.release(10)
    assert "used=0" in repr(budget)
