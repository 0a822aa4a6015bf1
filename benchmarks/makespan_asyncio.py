# SPDX-License-Identifier: BSL-1.0
"""makespan_bench's study in Python asyncio, so both languages' makespans sit side by side.

The same two scenarios (14 calls of 1-5 s; 200 calls of 50-500 ms) with the same
latencies (sluice::testing::latency::uniform's formula, drawn per call index),
on a virtual-time event loop (exact: the clock jumps to the next timer whenever
nothing is ready) and on real time with latencies scaled by 1/100 (makespans
reported unscaled). Strategies: one after another; fixed batches of `limit`
(asyncio.gather in chunks); the seeds' 8-line gather_with_concurrency (a
semaphore around every coroutine, all handed to asyncio.gather); and the ideal
greedy schedule, computed here independently.

Usage: python3 makespan_asyncio.py [--json PATH]
"""
import asyncio
import heapq
import json
import sys
import time

M64 = (1 << 64) - 1
REAL_TIME_SCALE = 1 / 100
LIMITS = [1, 2, 3, 5, 8, 13, 21, 34, 0]  # 0: unbounded
SCENARIOS = [("amenity", 14, 1000, 5000, 7), ("calls200", 200, 50, 500, 11)]


def mix(x):
    """splitmix64, as sluice::detail::mix."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def latency_s(lo_ms, hi_ms, seed, index):
    """sluice::testing::latency::uniform(lo, hi, seed) for call `index`, in seconds."""
    span = hi_ms - lo_ms + 1
    return (lo_ms + mix(((seed * 0x100000001B3) & M64) ^ index) % span) / 1000


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer instead of sleeping."""

    def __init__(self):
        super().__init__()
        self._virtual_now = 0.0
        real, loop = self._selector, self

        class Selector:
            def select(self, timeout=None):
                if timeout is not None and timeout > 0:
                    loop._virtual_now += timeout
                return real.select(0)

            def __getattr__(self, name):
                return getattr(real, name)

        self._selector = Selector()

    def time(self):
        return self._virtual_now


class Service:
    """The slow service: call i sleeps its latency; counts calls in flight."""

    def __init__(self, scenario, scale):
        _, _, self.lo, self.hi, self.seed = scenario
        self.scale, self.calls, self.in_flight, self.max_in_flight = scale, 0, 0, 0

    async def call(self):
        index = self.calls
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(latency_s(self.lo, self.hi, self.seed, index) * self.scale)
        self.in_flight -= 1


async def sequential(svc, n, limit):
    for _ in range(n):
        await svc.call()


async def batches(svc, n, limit):
    for b in range(0, n, limit):
        await asyncio.gather(*(svc.call() for _ in range(b, min(n, b + limit))))


async def gather_with_concurrency(max_concurrency, *coroutines):
    """The seeds' helper, as their article gives it."""
    semaphore = asyncio.Semaphore(max_concurrency)

    async def sem_coroutine(coro):
        async with semaphore:
            return await coro

    return await asyncio.gather(*(sem_coroutine(c) for c in coroutines),
                                return_exceptions=True)


async def seeds_gather(svc, n, limit):
    await gather_with_concurrency(limit, *(svc.call() for _ in range(n)))


def ideal_seconds(scenario, limit):
    _, n, lo, hi, seed = scenario
    free_at = [0.0] * min(limit, n)
    end = 0.0
    for i in range(n):
        t = heapq.heappop(free_at) + latency_s(lo, hi, seed, i)
        heapq.heappush(free_at, t)
        end = max(end, t)
    return end


def run(strategy, scenario, limit, virtual):
    n = scenario[1]
    svc = Service(scenario, 1.0 if virtual else REAL_TIME_SCALE)
    loop = VirtualTimeLoop() if virtual else asyncio.new_event_loop()
    try:
        t0, w0 = loop.time(), time.perf_counter()
        loop.run_until_complete(strategy(svc, n, limit))
        took = loop.time() - t0 if virtual else (time.perf_counter() - w0) / REAL_TIME_SCALE
    finally:
        loop.close()
    assert svc.calls == n and svc.in_flight == 0
    return took, svc.max_in_flight


def study():
    rows = []
    for sc in SCENARIOS:
        name, n = sc[0], sc[1]
        for limit in LIMITS:
            rows.append(dict(scenario=name, clock="ideal", strategy="ideal", limit=limit,
                             makespan_s=ideal_seconds(sc, limit or n)))
        for virtual in (True, False):
            clock = "virtual" if virtual else "real"
            plan = [("sequential", sequential, [1])]
            plan += [("batches", batches, LIMITS), ("gather_with_concurrency", seeds_gather, LIMITS)]
            for sname, fn, limits in plan:
                for limit in limits:
                    took, peak = run(fn, sc, limit or n, virtual)
                    ideal = ideal_seconds(sc, 1 if sname == "sequential" else (limit or n))
                    rows.append(dict(scenario=name, clock=clock, strategy=sname, limit=limit,
                                     makespan_s=took, ideal_s=ideal, ratio=took / ideal,
                                     max_in_flight=peak))
    return rows


if __name__ == "__main__":
    rows = study()
    for r in rows:
        print(f"asyncio {r['scenario']:9s} {r['clock']:8s} {r['strategy']:24s} "
              f"limit {r['limit'] or 'inf':>4}: {r['makespan_s']:8.3f} s")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump({"study": rows}, f, indent=1)
