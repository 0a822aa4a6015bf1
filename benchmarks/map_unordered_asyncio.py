# SPDX-License-Identifier: BSL-1.0
"""The map_unordered_bench workload in Python asyncio, for comparison.

Immediately-completing coroutines, limit 64, a lazy input of N integers, read
in completion order with the bounded asyncio.wait(FIRST_COMPLETED) pattern
(the correct one from "the story of async imap_unordered()"), beside a plain
sequential await loop. Prints nanoseconds per task.
"""
import asyncio
import time

N = 200_000
LIMIT = 64


async def immediate(i):
    return i


async def map_unordered(func, iterable, limit):
    it = iter(iterable)
    ended = False
    pending = set()
    while pending or not ended:
        while len(pending) < limit and not ended:
            try:
                x = next(it)
            except StopIteration:
                ended = True
            else:
                pending.add(asyncio.ensure_future(func(x)))
        if not pending:
            return
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            yield t.result()


async def sequential():
    total = 0
    for i in range(N):
        total += await immediate(i)
    return total


async def mapped():
    total = 0
    async for r in map_unordered(immediate, range(N), LIMIT):
        total += r
    return total


def measure(main):
    start = time.perf_counter()
    total = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert total == N * (N - 1) // 2
    return elapsed * 1e9 / N


if __name__ == "__main__":
    print(f"asyncio sequential await loop: {measure(sequential):8.1f} ns/task")
    print(f"asyncio map_unordered (limit {LIMIT}): {measure(mapped):8.1f} ns/task")
