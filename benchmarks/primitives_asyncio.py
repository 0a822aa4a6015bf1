# SPDX-License-Identifier: BSL-1.0
"""The baselines of benchmarks/primitives_bench.cpp in Python asyncio.

Prints ns per operation for:
  nested await              await of a trivial coroutine (the floor)
  semaphore uncontended     await sem.acquire(); sem.release()
  loop round trip           await asyncio.sleep(0) (one trip through the loop)
  semaphore hand-off        two tasks ping-pong through two semaphores, per hand-off
  event set, 100k waiters   Event.set() until all 100,000 waiters resumed, per waiter
"""
import asyncio
import json
import sys
import time

N = 200_000


async def trivial():
    return None


async def bench_nested(n):
    t0 = time.perf_counter()
    for _ in range(n):
        await trivial()
    return (time.perf_counter() - t0) / n


async def bench_uncontended(n):
    sem = asyncio.Semaphore(1)
    t0 = time.perf_counter()
    for _ in range(n):
        await sem.acquire()
        sem.release()
    return (time.perf_counter() - t0) / n


async def bench_round_trip(n):
    t0 = time.perf_counter()
    for _ in range(n):
        await asyncio.sleep(0)
    return (time.perf_counter() - t0) / n


async def bench_handoff(n):
    ping, pong = asyncio.Semaphore(0), asyncio.Semaphore(0)

    async def answer():
        for _ in range(n):
            await ping.acquire()
            pong.release()

    other = asyncio.create_task(answer())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for _ in range(n):
        ping.release()
        await pong.acquire()
    elapsed = time.perf_counter() - t0
    await other
    return elapsed / (2 * n)


async def bench_event(waiters):
    ev = asyncio.Event()
    woken = 0

    async def waiter():
        nonlocal woken
        await ev.wait()
        woken += 1

    tasks = [asyncio.create_task(waiter()) for _ in range(waiters)]
    await asyncio.sleep(0)  # every waiter parked
    t0 = time.perf_counter()
    ev.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    assert woken == waiters
    return elapsed / waiters


async def main():
    rows = [
        ("asyncio_nested_await", await bench_nested(N)),
        ("asyncio_semaphore_uncontended", await bench_uncontended(N)),
        ("asyncio_loop_round_trip", await bench_round_trip(N // 4)),
        ("asyncio_semaphore_handoff", await bench_handoff(N // 4)),
        ("asyncio_event_set_wakes_100k", await bench_event(100_000)),
    ]
    for name, seconds in rows:
        print(f"{name:40s} {seconds * 1e9:10.1f} ns/op")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump({name: seconds * 1e9 for name, seconds in rows}, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
