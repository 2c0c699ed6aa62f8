"""``Turns`` (aioloader/runtime/turns.py): a semaphore whose waiters go by key."""

from __future__ import annotations

import asyncio

import pytest

from aioloader.runtime.turns import Turns


async def _hold(turns: Turns, key: object, log: list[object], go: asyncio.Event) -> None:
    async with turns.turn(key):
        log.append(key)
        await go.wait()


async def test_freed_turns_go_to_the_lowest_key_not_the_first_to_ask() -> None:
    turns, log, go = Turns(1), [], asyncio.Event()
    first = asyncio.create_task(_hold(turns, (9, 9), log, go))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(_hold(turns, key, log, go)) for key in [(3, 0), (1, 5), (1, 2)]]
    await asyncio.sleep(0.01)
    assert log == [(9, 9)]
    go.set()
    await asyncio.gather(first, *waiting)
    assert log == [(9, 9), (1, 2), (1, 5), (3, 0)]


async def test_never_more_holders_than_turns() -> None:
    turns, inside, most = Turns(3), 0, 0

    async def one(key: int) -> None:
        nonlocal inside, most
        async with turns.turn(key):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.gather(*(one(k % 7) for k in range(50)))
    assert most == 3


async def test_a_cancelled_waiter_gives_up_its_place_and_loses_no_turn() -> None:
    turns, log, go = Turns(1), [], asyncio.Event()
    holder = asyncio.create_task(_hold(turns, 0, log, go))
    await asyncio.sleep(0)
    quitter = asyncio.create_task(_hold(turns, 1, log, go))
    after = asyncio.create_task(_hold(turns, 2, log, go))
    await asyncio.sleep(0.01)
    quitter.cancel()
    go.set()
    await asyncio.gather(holder, after)
    assert log == [0, 2]
    assert quitter.cancelled()
    async with asyncio.timeout(1):  # the turn came back: a new holder gets it at once
        async with turns.turn(5):
            pass


async def test_a_waiter_cancelled_as_it_was_handed_the_turn_passes_it_on() -> None:
    turns, log, go = Turns(1), [], asyncio.Event()
    go.set()
    held = turns.turn(0)
    await held.__aenter__()
    handed = asyncio.create_task(_hold(turns, 1, log, go))
    nxt = asyncio.create_task(_hold(turns, 2, log, go))
    await asyncio.sleep(0.01)
    await held.__aexit__(None, None, None)  # the turn goes to 1, which has not run yet
    handed.cancel()
    async with asyncio.timeout(1):
        await nxt
    assert log == [2] and handed.cancelled()


@pytest.mark.parametrize("n", [0, -1])
def test_turns_needs_at_least_one(n: int) -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        Turns(n)
