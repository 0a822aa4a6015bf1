# SPDX-License-Identifier: BSL-1.0
"""The Python side of `make bench-peers` (benchmarks/peers.py): asyncio and
Trio, with the same command line and answer as benchmarks/peers/sluice_peer.cpp.

  py_peer.py asyncio|trio <workload> <kind> <n>
    fanout   a semaphore (asyncio.Semaphore / trio.CapacityLimiter) of 100 is
             acquired by the spawning loop before each task is started
             (asyncio.create_task / nursery.start_soon) and released by the task
             when it ends (lazy: at most 100 tasks exist); results[i] = task(i)
    stream   the same with 64, each result added to the sum as its task ends
    handoff  two tasks ping-pong through two semaphores of 0 (asyncio.Semaphore(0);
             trio.Semaphore(0)); n hand-offs in all
    kind     immediate: task(i) returns i+1; suspending: asyncio.sleep(0) /
             trio.sleep(0) first
"""
import json
import sys
import time


def main():
    if len(sys.argv) < 5:
        sys.exit("usage: py_peer.py asyncio|trio fanout|stream|handoff immediate|suspending N")
    lib, workload, kind, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    susp = kind == "suspending"
    if lib == "asyncio":
        import asyncio as aio

        sleep0 = aio.sleep

        async def run_fan(limit, keep):
            sem = aio.Semaphore(limit)
            results = [0] * n if keep else None
            total = [0]
            tasks = set()

            async def one(i):
                try:
                    if susp:
                        await sleep0(0)
                    if keep:
                        results[i] = i + 1
                    else:
                        total[0] += i + 1
                finally:
                    sem.release()

            for i in range(n):
                await sem.acquire()
                t = aio.create_task(one(i))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            for _ in range(limit):
                await sem.acquire()
            return sum(results) if keep else total[0]

        async def run_handoff():
            sems = [aio.Semaphore(0), aio.Semaphore(0)]
            return await handoff(sems, lambda s: s.acquire(), lambda s: s.release(),
                                 lambda coros: aio.gather(*coros))

        def runner(f):
            return aio.run(f())
    elif lib == "trio":
        import trio

        sleep0 = trio.sleep

        async def run_fan(limit, keep):
            lim = trio.CapacityLimiter(limit)
            results = [0] * n if keep else None
            total = [0]

            async def one(i, token):
                try:
                    if susp:
                        await sleep0(0)
                    if keep:
                        results[i] = i + 1
                    else:
                        total[0] += i + 1
                finally:
                    lim.release_on_behalf_of(token)

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    token = object()
                    await lim.acquire_on_behalf_of(token)
                    nursery.start_soon(one, i, token)
            return sum(results) if keep else total[0]

        async def run_handoff():
            sems = [trio.Semaphore(0), trio.Semaphore(0)]

            async def both(coros):
                async with trio.open_nursery() as nursery:
                    for c in coros:
                        nursery.start_soon(lambda c=c: c)
            return await handoff(sems, lambda s: s.acquire(), lambda s: s.release(), both)

        runner = trio.run
    else:
        sys.exit(f"unknown runtime {lib}")

    async def handoff(sems, acquire, release, run_both):
        waiting = [False, False]
        count = [0, 0]  # sum, handoffs

        async def player(me):
            while True:
                waiting[me] = True
                await acquire(sems[me])
                waiting[me] = False
                if count[0] >= n:
                    release(sems[1 - me])
                    return
                count[0] += 1
                if waiting[1 - me]:
                    count[1] += 1
                release(sems[1 - me])

        async def start():
            release(sems[0])
        await run_both([player(0), player(1), start()])
        return tuple(count)

    async def body():
        if workload == "fanout":
            return await run_fan(100, True), 0
        if workload == "stream":
            return await run_fan(64, False), 0
        if workload == "handoff":
            return await run_handoff()
        sys.exit(f"unknown workload {workload}")

    t0 = time.process_time_ns()
    total, handoffs = runner(body)
    t1 = time.process_time_ns()
    rss = -1
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1])
    print(json.dumps({"ns": (t1 - t0) / n, "sum": total, "handoffs": handoffs, "rss_kib": rss}))


if __name__ == "__main__":
    main()
