# SPDX-License-Identifier: BSL-1.0
"""The gather benchmark's workload in Python asyncio, on this machine.

Tasks complete immediately, as in gather_bench.cpp; prints ns per task for a
sequential await loop, the semaphore-wrapped gather_with_concurrency users
write (limit 8), and plain asyncio.gather.
"""
import asyncio
import time

N = 10_000
ROUNDS = 5


async def instant(x):
    return x + 1


async def sequential():
    s = 0
    for i in range(N):
        s += await instant(i)
    return s


async def gather_with_concurrency(limit, coros):
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def bounded():
    return await gather_with_concurrency(8, [instant(i) for i in range(N)])


async def unbounded():
    return await asyncio.gather(*(instant(i) for i in range(N)))


def measure(fn):
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        asyncio.run(fn())
        best = min(best, time.perf_counter() - t0)
    return best / N * 1e9


if __name__ == "__main__":
    for name, fn in [("asyncio_sequential_await", sequential),
                     ("asyncio_gather_with_concurrency/8", bounded),
                     ("asyncio_gather_unbounded", unbounded)]:
        print(f"{name:40s} {measure(fn):10.1f} ns/task")
