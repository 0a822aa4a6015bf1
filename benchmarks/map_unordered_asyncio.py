# SPDX-License-Identifier: BSL-1.0
"""The map_unordered_bench workload in Python asyncio, for comparison.

Immediately-completing coroutines, limit 64, a lazy input of N integers, read
in completion order with the bounded asyncio.wait(FIRST_COMPLETED) pattern
(the correct one from "the story of async imap_unordered()"), beside a plain
sequential await loop. Prints nanoseconds per task; --json PATH also writes
{name: ns_per_task}.
"""
import asyncio
import json
import sys
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
    results = {"asyncio_floor_lazy/immediate": measure(sequential),
               f"asyncio_map_unordered/immediate/{LIMIT}": measure(mapped)}
    for name, ns in results.items():
        print(f"{name:40s} {ns:10.1f} ns/task")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1)
