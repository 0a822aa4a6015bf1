# SPDX-License-Identifier: BSL-1.0
"""gather_bench's workloads in Python asyncio, on this machine.

Both task kinds, as in gather_bench.cpp: completing at once, and suspending
once (asyncio.sleep(0): one trip through the loop). Workloads: a sequential
await loop (the floor), the seeds' semaphore-wrapped gather_with_concurrency
(limits 8 and 100), and plain asyncio.gather. Prints ns per task (best of
ROUNDS); --json PATH also writes {name: ns_per_task}.
"""
import asyncio
import json
import sys
import time

N = 10_000
ROUNDS = 5


async def immediate(x):
    return x + 1


async def suspending(x):
    await asyncio.sleep(0)
    return x + 1


async def floor_lazy(task):
    s = 0
    for i in range(N):
        s += await task(i)
    return s


async def gather_with_concurrency(limit, coros):
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)


def gwc(limit):
    async def run(task):
        return await gather_with_concurrency(limit, [task(i) for i in range(N)])
    return run


async def gather_unbounded(task):
    return await asyncio.gather(*(task(i) for i in range(N)))


def measure(fn, task):
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        asyncio.run(fn(task))
        best = min(best, time.perf_counter() - t0)
    return best / N * 1e9


if __name__ == "__main__":
    results = {}
    for kind, task in [("immediate", immediate), ("suspending", suspending)]:
        for name, fn in [(f"asyncio_floor_lazy/{kind}/{N}", floor_lazy),
                         (f"asyncio_gwc/{kind}/8", gwc(8)),
                         (f"asyncio_gwc/{kind}/100", gwc(100)),
                         (f"asyncio_gather/{kind}/{N}", gather_unbounded)]:
            results[name] = measure(fn, task)
            print(f"{name:40s} {results[name]:10.1f} ns/task")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1)
