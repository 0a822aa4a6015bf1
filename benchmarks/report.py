# SPDX-License-Identifier: BSL-1.0
"""`make bench`'s report: runs the benchmarks, collects their JSON, draws the plots.

  python3 benchmarks/report.py [--build DIR] [--out DIR] [--min-time S] [--repetitions N]
                               [--no-run] [--docs DIR] [--page docs/performance.md]
                               [--readme README.md]

1. Runs every Google Benchmark binary DIR/benchmarks/*_bench with
   --benchmark_format=json --benchmark_out=OUT/<name>.json (timing cases:
   --benchmark_repetitions=N with random interleaving, the median is kept), and
   every benchmarks/*_asyncio.py with --json OUT/<name>.json.
2. Merges them into OUT/report.json: {"context", "timings": {name: value},
   "study": [rows], "targets": [rows]}. A timing value is ns per task (or per
   operation); a study row is one (language, scenario, clock, strategy, limit).
3. Draws OUT/makespan.{png,svg} (makespan vs limit per strategy) and
   OUT/ns_per_task.{png,svg} (ns per task per workload, log scale).
4. --docs DIR copies the plots there; --page FILE (docs/performance.md)
   rewrites the block between `<!-- bench:begin -->` and `<!-- bench:end -->`
   with the tables made here from report.json, and --readme FILE (README.md)
   the headline between `<!-- bench-headline:begin -->` and
   `<!-- bench-headline:end -->` from the same numbers (nothing in either is
   typed by hand).
--no-run skips 1 and rebuilds 2-4 from the JSON already in OUT. OUT/peers.json
(`make bench-peers`, benchmarks/peers.py) is folded in when present: its
results as "peers:<program>/<workload>/<kind>" timings and a plot group.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITS = [1, 2, 3, 5, 8, 13, 21, 34, 0]


# The cases run again on Boost.Asio (--boost-build): the Asio peers whose cost
# or availability depends on the Asio version.
BOOST_FILTER = {"gather_bench": "parallel_group_ranged|(gather|cospawn_counter)_lazy/.*/10000$|pair_",
                "primitives_bench": "handoff|post_round_trip|transfer"}


# The limits' benchmarks, each with its own baselines (see limits_table).
LIMIT_BENCHES = ("rate_limiter_bench", "keyed_bench", "shared_semaphore_bench", "redis_bench")

# Binaries whose cases are read only as "<binary>:<case>": they repeat case
# names of primitives_bench (nested_co_await, semaphore_uncontended) with
# their own floors, and a later binary must not replace primitives_bench's
# numbers (the targets and the primitives table read those unprefixed).
PREFIXED_ONLY = LIMIT_BENCHES + ("stats_bench", "strand_bound_bench", "fair_bench")


def run_benchmarks(build, out, min_time, repetitions, prefix="", filters=None):
    for exe in sorted(glob.glob(os.path.join(build, "benchmarks", "*_bench"))):
        name = os.path.basename(exe)
        if filters is not None and name not in filters:
            continue
        args = [exe, "--benchmark_format=json", f"--benchmark_out={out}/{prefix}{name}.json",
                "--benchmark_out_format=json"]
        if filters is not None:
            args.append(f"--benchmark_filter={filters[name]}")
        if name != "makespan_bench":
            args += [f"--benchmark_min_time={min_time}"]
            if repetitions > 1:
                args += [f"--benchmark_repetitions={repetitions}",
                         "--benchmark_enable_random_interleaving=true",
                         "--benchmark_report_aggregates_only=true"]
        t0 = time.monotonic()
        print(f"== {prefix}{name}", end=" ", flush=True)
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        print(f"({time.monotonic() - t0:.0f} s)", flush=True)
    if filters is not None:
        return
    for script in sorted(glob.glob(os.path.join(HERE, "*_asyncio.py"))):
        name = os.path.splitext(os.path.basename(script))[0]
        t0 = time.monotonic()
        print(f"== {name}.py", end=" ", flush=True)
        subprocess.run([sys.executable, script, "--json", f"{out}/{name}.json"], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"({time.monotonic() - t0:.0f} s)", flush=True)


def load_google(path, timings, study, prefix=""):
    with open(path) as f:
        data = json.load(f)
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = prefix + b.get("run_name", b["name"]).split("/iterations:")[0]
        if name.startswith("study/"):
            _, scenario, clock, strategy, limit = name.split("/")
            study.append(dict(language="C++", scenario=scenario, clock=clock, strategy=strategy,
                              limit=int(limit), makespan_s=b["makespan_s"],
                              ideal_s=b.get("ideal_s"), ratio=b.get("ratio"),
                              max_in_flight=b.get("max_in_flight")))
            continue
        if "allocs_per_task" in b:
            timings[name + "/allocs"] = b["allocs_per_task"]
        elif "allocs" in b:  # stats_bench: heap allocations per iteration
            timings[name + "/allocs"] = b["allocs"]
        for counter in ("ns_per_task", "per_handoff", "per_item", "per_waiter", "per_post",
                        "per_acquire", "per_call"):
            if counter in b:
                timings[name] = b[counter] * 1e9  # Google Benchmark writes seconds
                break
        else:
            if name == "harness_virtual_calls":
                timings[name + "/calls_per_s"] = b["items_per_second"]
            elif name.startswith("peak_rss"):
                timings[name + "/peak_rss_kb"] = b["peak_rss_kb"]
                timings[name + "/rss_growth_kb"] = b["rss_growth_kb"]
            else:  # plain per-iteration time in ns (wall time where the case asked for it)
                clock = "real_time" if name.endswith("/real_time") else "cpu_time"
                timings[name] = b[clock] * {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
    return data.get("context", {})


def collect(out):
    timings, study, context = {}, [], {}
    for path in sorted(glob.glob(os.path.join(out, "*_bench.json"))):
        base = os.path.basename(path)
        name = base[:-len(".json")]
        if base.startswith("boost_"):
            load_google(path, timings, study, "boost:")
        elif name in PREFIXED_ONLY:
            # These binaries share case names (their own floors): only under
            # "<binary>:<case>", so each ratio stays in one process.
            ctx = load_google(path, timings, [], name + ":")
            context = ctx or context
            if ctx.get("load_avg"):  # the 1-minute load average when it ran
                timings[name + ":load_avg"] = ctx["load_avg"][0]
        else:
            context = load_google(path, timings, study) or context
    peers = os.path.join(out, "peers.json")  # make bench-peers (benchmarks/peers.py)
    if os.path.exists(peers):
        with open(peers) as f:
            data = json.load(f)
        for key, r in data["results"].items():
            if "ns" in r:
                timings["peers:" + key] = r["ns"]
            if "peak_rss_kib" in r:
                timings["peers:" + key + "/peak_rss_kb"] = r["peak_rss_kib"]
        context = dict(context, peers=data["context"])
    for path in sorted(glob.glob(os.path.join(out, "*_asyncio.json"))):
        with open(path) as f:
            data = json.load(f)
        if "study" in data:
            for row in data["study"]:
                if row["clock"] != "ideal":
                    study.append(dict(language="Python asyncio", **row))
        else:
            timings.update(data)
    return timings, study, context


# ---------------------------------------------------------------- targets

def ratio(t, a, b):
    return t[a] / t[b] if a in t and b in t else None


def targets(t, study):
    rows = []

    def add(target, value, ok, fmt="{:.2f}x"):
        rows.append(dict(target=target, measured=None if value is None else fmt.format(value),
                         met=None if value is None else bool(ok(value))))

    for k in ("immediate", "suspending"):
        for form in ("lazy", "vector"):
            r = ratio(t, f"gwc_{form}/{k}/100", f"pool_{form}/{k}/100")
            add(f"`gather_with_concurrency(100, {form})` ≤ 1.1x Asio worker pool, {k}", r,
                lambda v: v <= 1.1)
        r = ratio(t, f"gwc_lazy/{k}/100", f"floor_lazy/{k}/10000")
        add(f"`gather_with_concurrency(100, lazy)` ≤ 1.5x lazy floor, {k}", r, lambda v: v <= 1.5)
        # With suspending tasks no fan-out beats the lazy floor (one post per
        # task), so the floor's own speed-up over the baseline is the ceiling.
        for base, what, goal, fmt in [
                ("cospawn_semaphore", "`co_spawn` + semaphore (limit 8)", 8, "{:.1f}x"),
                ("asyncio_gwc", "asyncio `gather_with_concurrency(8)`", 200, "{:.0f}x")]:
            r = ratio(t, f"{base}/{k}/8", f"gwc_lazy/{k}/8")
            ceiling = ratio(t, f"{base}/{k}/8", f"floor_lazy/{k}/10000")
            text = fmt + " faster"
            if k == "suspending" and ceiling is not None:
                text += " (ceiling: the lazy floor itself is " + fmt.format(ceiling) + " faster)"
            add(f"≥ {goal}x faster than {what}, {k}", r, lambda v, g=goal: v >= g, text)
    for form in ("lazy", "vector"):
        for n in (10_000, 100_000, 1_000_000):
            r = ratio(t, f"gather_{form}/suspending/{n}", f"cospawn_counter_{form}/suspending/{n}")
            text = "{:.2f}x"
            ga = t.get(f"gather_{form}/suspending/{n}/allocs")
            ca = t.get(f"cospawn_counter_{form}/suspending/{n}/allocs")
            if ga is not None and ca is not None:
                text += f" ({ga:.2f} vs {ca:.2f} allocations/task)"
            add(f"unbounded `gather` ({form}, {n:,} suspending tasks) ≤ 1.1x `co_spawn` + counter",
                r, lambda v: v <= 1.1, text)
            if form == "lazy":
                r = ratio(t, f"gather_lazy/suspending/{n}", f"cospawn_cancellable_lazy/suspending/{n}")
                add("(for reference) the same ≤ 1.1x `co_spawn` + counter + a signal per task",
                    r, lambda v: v <= 1.1)
    for k in ("immediate", "suspending"):
        r = ratio(t, f"map_unordered_for_each/{k}/64", f"mu_floor_lazy/{k}/64")
        add(f"`map_unordered` ≤ 2x lazy floor (read by `for_each`), {k}", r, lambda v: v <= 2)
        r = ratio(t, f"map_unordered/{k}/64", f"mu_floor_lazy/{k}/64")
        add(f"(for reference) the same read by a `co_await s.next()` loop, {k}", r,
            lambda v: v <= 2)
    add("uncontended semaphore ≤ 2x one nested `co_await`",
        ratio(t, "semaphore_uncontended", "nested_co_await"), lambda v: v <= 2)
    add("contended hand-off ≤ one post", ratio(t, "semaphore_handoff", "post_round_trip"),
        lambda v: v <= 1.0, "{:.2f} posts")
    add("contended hand-off ≤ `asio::experimental::channel` ping-pong",
        ratio(t, "semaphore_handoff", "channel_handoff"), lambda v: v <= 1.0)
    add("contended hand-off ≤ one post, Boost.Asio 1.81",
        ratio(t, "boost:semaphore_handoff", "boost:post_round_trip"), lambda v: v <= 1.0,
        "{:.2f} posts")
    add("contended hand-off ≤ `experimental::channel` ping-pong, Boost.Asio 1.81",
        ratio(t, "boost:semaphore_handoff", "boost:channel_handoff"), lambda v: v <= 1.0)
    bounded = [r for r in study if r["language"] == "C++" and r["strategy"] in
               ("gather_with_concurrency", "map_unordered", "cospawn_semaphore")]
    virt = [abs(r["makespan_s"] - r["ideal_s"]) for r in bounded if r["clock"] == "virtual"]
    add("bounded makespan = ideal schedule, virtual time (largest difference, "
        "co_spawn + semaphore, gather_with_concurrency, map_unordered, every limit)",
        max(virt) if virt else None, lambda v: v < 1e-9, "{:.0f} ns")
    for sc, what in [("amenity", "14 calls of 10–50 ms"), ("calls200", "200 calls of 0.5–5 ms")]:
        real = [r["ratio"] for r in bounded if r["clock"] == "real" and r["scenario"] == sc and
                r["strategy"] == "gather_with_concurrency"]
        add(f"bounded makespan within 5% of ideal, real time, {what} (worst "
            "`gather_with_concurrency` over the limits)",
            max(real) if real else None, lambda v: v <= 1.05, "{:.3f}x")
    # Growth during the run: the child's absolute high-water mark also counts
    # the pages it shares with the parent at fork time, which depend on what
    # the parent ran before.
    a, b = t.get("peak_rss/10000/rss_growth_kb"), t.get("peak_rss/10000000/rss_growth_kb")
    add("`map_unordered` memory growth during the run, 10M inputs vs 10k", (a, b) if a and b
        else None, lambda v: v[1] <= 1.05 * v[0], "{0[1]:.0f} kB vs {0[0]:.0f} kB")
    allocs = [t[k] for k in t if k.startswith("stats_bench:") and k.endswith("/allocs")]
    add("stats: no allocation per acquisition (`stats_bench`, most over its cases)",
        max(allocs) if allocs else None, lambda v: v < 0.001, "{:.3f} allocations/iteration")
    calls = t.get("harness_virtual_calls/calls_per_s")
    add("harness ≥ 1 million simulated calls/s", calls / 1e6 if calls else None,
        lambda v: v >= 1, "{:.2f} million/s")
    return rows


# ---------------------------------------------------------------- tables

def fmt_ns(v):
    return "—" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}")


def table_rows(t, rows, floor_of):
    """rows: (label, key template with {k}); floor_of(k) -> key of the floor."""
    lines = ["| workload | immediate: ns/task | × floor | suspending once: ns/task | × floor |",
             "|---|---|---|---|---|"]
    for label, key in rows:
        cells = []
        for k in ("immediate", "suspending"):
            v, f = t.get(key.format(k=k)), t.get(floor_of(k))
            cells += [fmt_ns(v), "—" if v is None or not f else f"{v / f:.2f}x"]
        if all(c == "—" for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def study_table(study):
    shown = [1, 3, 5, 8, 13, 0]
    out = ["**The study** (`benchmarks/makespan_bench.cpp`, `benchmarks/makespan_asyncio.py`): "
           "makespan in seconds, virtual time (exact); in brackets the real-time run "
           "(latencies scaled by 1/100, reported unscaled)", "",
           "| scenario | strategy | " + " | ".join(f"limit {l or '∞'}" for l in shown) + " |",
           "|---|---|" + "---|" * len(shown)]
    names = [("C++", "sequential", "one after another"),
             ("C++", "batches", "fixed batches of `limit`"),
             ("C++", "cospawn_semaphore", "`co_spawn` per call + `sluice::semaphore`"),
             ("C++", "gather_with_concurrency", "`sluice::gather_with_concurrency`"),
             ("C++", "map_unordered", "`sluice::map_unordered`"),
             ("Python asyncio", "batches", "asyncio: `gather` in chunks"),
             ("Python asyncio", "gather_with_concurrency", "asyncio: the seeds' 8 lines"),
             ("C++", "ideal", "ideal greedy schedule")]
    for sc, title in [("amenity", "14 calls, 1–5 s"), ("calls200", "200 calls, 50–500 ms")]:
        for lang, strategy, label in names:
            cells = []
            for l in shown:
                def get(clock):
                    for r in study:
                        if (r["language"], r["scenario"], r["clock"], r["strategy"]) == \
                                (lang, sc, clock, strategy) and \
                                r["limit"] == (1 if strategy == "sequential" else l):
                            return r
                    return None
                if strategy == "ideal":
                    v = next(
                        (r for r in study if r["scenario"] == sc and r["clock"] == "virtual" and
                         r["strategy"] == "gather_with_concurrency" and r["limit"] == l), None)
                    cells.append(f"{v['ideal_s']:.2f}" if v else "—")
                    continue
                v, rt = get("virtual"), get("real")
                cell = f"{v['makespan_s']:.2f}" if v else "—"
                if rt:
                    cell += f" ({rt['makespan_s']:.2f})"
                cells.append(cell)
            out.append(f"| {title} | {label} | " + " | ".join(cells) + " |")
    return out


def markdown(t, study, target_rows):
    out = study_table(study) + [""]
    out += ["**Fan-out, 10,000 tasks** (`benchmarks/gather_bench.cpp`, "
            "`benchmarks/gather_asyncio.py`; × the lazy floor)", ""]
    out += table_rows(t, [
        ("lazy floor: `for (i) co_await task(i)`", "floor_lazy/{k}/10000"),
        ("the same over a vector of pre-made awaitables", "floor_vector/{k}/10000"),
        ("`sluice::gather_with_concurrency(100, lazy)`", "gwc_lazy/{k}/100"),
        ("Asio peer: 100 `co_spawn`ed workers on a shared index", "pool_lazy/{k}/100"),
        ("`sluice::gather_with_concurrency(100, vector)`", "gwc_vector/{k}/100"),
        ("Asio peer: 100 workers over the vector", "pool_vector/{k}/100"),
        ("`sluice::gather_with_concurrency(8, lazy)`", "gwc_lazy/{k}/8"),
        ("Asio peer: 8 workers on a shared index", "pool_lazy/{k}/8"),
        ("one `co_spawn` per task behind a semaphore of 8", "cospawn_semaphore/{k}/8"),
        ("asyncio: sequential `await` loop", "asyncio_floor_lazy/{k}/10000"),
        ("asyncio: the seeds' `gather_with_concurrency(8)`", "asyncio_gwc/{k}/8"),
    ], lambda k: f"floor_lazy/{k}/10000")
    out += ["", "**Unbounded `gather`** (× hand-written `co_spawn` + counter over the same input; "
            "lazy input also × the same with a `cancellation_signal` bound to each task, "
            "which gather needs to cancel its children)", "",
            "| tasks | input | immediate: `gather` ns/task | × `co_spawn` + counter | "
            "suspending once: `gather` ns/task | × `co_spawn` + counter | × with signals | "
            "allocations/task: `gather`, counter, with signals |",
            "|---|---|---|---|---|---|---|---|"]
    for n in (10_000, 100_000, 1_000_000):
        for form in ("lazy", "vector"):
            cells = []
            for k in ("immediate", "suspending"):
                g, c = t.get(f"gather_{form}/{k}/{n}"), t.get(f"cospawn_counter_{form}/{k}/{n}")
                cells += [fmt_ns(g), "—" if g is None or c is None else f"{g / c:.2f}x"]
            g, c = t.get(f"gather_{form}/suspending/{n}"), t.get(f"cospawn_cancellable_{form}/suspending/{n}")
            cells.append("—" if g is None or c is None else f"{g / c:.2f}x")
            allocs = [t.get(f"{w}_{form}/suspending/{n}/allocs")
                      for w in ("gather", "cospawn_counter", "cospawn_cancellable")]
            cells.append(", ".join("—" if a is None else f"{a:.2f}" for a in allocs))
            out.append(f"| {n:,} | {form} | " + " | ".join(cells) + " |")
    for pre, where in [("", "this Asio"), ("boost:", "Boost.Asio 1.81 (Asio 1.26; `make bench-boost`)")]:
        # Only the timings "<pre>parallel_group_ranged/<kind>/10000": the same
        # prefix also names their allocation counts ("/allocs").
        pg = [(kind, t[k]) for kind in ("immediate", "suspending")
              for k in [f"{pre}parallel_group_ranged/{kind}/10000"] if k in t]
        if pg:
            parts = []
            for kind, v in pg:
                g = t.get(f"{pre}gather_lazy/{kind}/10000")
                allocs = t.get(f"{pre}parallel_group_ranged/{kind}/10000/allocs")
                parts.append(f"{kind}: {fmt_ns(v)} ns/task" +
                             (f", {allocs:.2f} allocations/task" if allocs is not None else "") +
                             (f" (sluice `gather` {fmt_ns(g)} ns/task, {g / v:.2f}x)" if g else ""))
            out += ["", f"Ranged `make_parallel_group(ops).async_wait(wait_for_all())` on {where}, "
                    "10,000 tasks — " + "; ".join(parts) + "."]
    if not any(k.startswith(("parallel_group_ranged/", "boost:parallel_group_ranged/")) for k in t):
        out += ["", "The ranged `make_parallel_group` needs Asio 1.24 (Boost 1.80); "
                "`make bench-boost` measures it on Boost.Asio 1.81."]
    out += ["", "**Two tasks** (per task; × sluice's `gather(a, b)`)", "",
            "| workload | immediate: ns/task | × `gather(a, b)` | suspending once: ns/task | "
            "× `gather(a, b)` |", "|---|---|---|---|---|"]
    out += table_rows(t, [
        ("`sluice::gather(a, b)`", "pair_gather/{k}/2"),
        ("Asio peer: `co_await (a && b)` (awaitable_operators)", "pair_operators/{k}/2"),
        ("Asio peer: `make_parallel_group(a, b).async_wait(wait_for_all())`",
         "pair_parallel_group/{k}/2"),
    ], lambda k: f"pair_gather/{k}/2")[2:]
    out += ["", "**Streaming, limit 64, 10,000 inputs** (`benchmarks/map_unordered_bench.cpp`; "
            "× the lazy floor)", ""]
    out += table_rows(t, [
        ("lazy floor: `co_await fn(x)` in turn", "mu_floor_lazy/{k}/64"),
        ("`sluice::for_each(sluice::map_unordered(fn, xs, 64), body)`",
         "map_unordered_for_each/{k}/64"),
        ("the same stream read by `while (auto r = co_await s.next())`", "map_unordered/{k}/64"),
        ("Asio peer: 64 workers → `asio::experimental::channel` of 64", "mu_channel_pool/{k}/64"),
        ("one `co_spawn` per task + counter", "mu_cospawn_per_task/{k}/64"),
        ("asyncio: bounded `wait(FIRST_COMPLETED)`", "asyncio_map_unordered/{k}/64"),
    ], lambda k: f"mu_floor_lazy/{k}/64")
    out += ["", "**Primitives** (`benchmarks/primitives_bench.cpp`; the Asio peer beside each)", "",
            "| workload | sluice ns | Asio peer | peer ns | sluice / peer | asyncio ns |",
            "|---|---|---|---|---|---|"]
    for label, ours, peer_label, peer, py in [
        ("uncontended `acquire` + `release`", "semaphore_uncontended", "one nested `co_await`",
         "nested_co_await", "asyncio_semaphore_uncontended"),
        ("contended hand-off (per hand-off)", "semaphore_handoff",
         "`experimental::channel` ping-pong", "channel_handoff", "asyncio_semaphore_handoff"),
        ("contended hand-off (per hand-off)", "semaphore_handoff", "one `post` round trip",
         "post_round_trip", "asyncio_loop_round_trip"),
        ("`queue` of 16, producer → consumer (per item)", "queue_transfer",
         "`experimental::channel` of 16", "channel_transfer", None),
        ("`event::set` waking 100,000 waiters (per waiter)", "event_set_wakes_100k", "—", None,
         "asyncio_event_set_wakes_100k"),
    ]:
        a, b = t.get(ours), t.get(peer) if peer else None
        out.append(f"| {label} | {fmt_ns(a)} | {peer_label} | {fmt_ns(b)} | "
                   f"{'—' if a is None or b is None else f'{a / b:.2f}x'} | "
                   f"{fmt_ns(t.get(py)) if py else '—'} |")
    out += limits_table(t)
    out += stats_table(t)
    out += ["", "**Against DESIGN.md's targets** (generated from `build/bench/report.json`)", "",
            "| target | measured | |", "|---|---|---|"]
    for r in target_rows:
        status = "—" if r["met"] is None else ("met" if r["met"] else "*missed*")
        out.append(f"| {r['target']} | {r['measured'] or 'not measured'} | {status} |")
    return "\n".join(out) + "\n"


def limits_table(t):
    """Provider limits, the process-wide cap and the fleet: each beside the
    same binary's `sluice::semaphore` and a peer measured in that binary."""
    out = ["", "**Limits** (`rate_limiter_bench`, `keyed_bench`, `shared_semaphore_bench`, "
           "`redis_bench`; CPU ns per acquire + release unless marked wall; each ratio within "
           "one binary)", "",
           "| workload | sluice ns | × `sluice::semaphore` | peer | peer ns | sluice / peer |",
           "|---|---|---|---|---|---|"]
    rl, kb = "rate_limiter_bench:", "keyed_bench:"
    ss, rb = "shared_semaphore_bench:", "redis_bench:"
    rows = [
        ("`rate_limiter::acquire()`, window has room", rl + "rate_limiter_acquire_free",
         rl + "semaphore_uncontended", "one nested `co_await`", rl + "nested_co_await"),
        ("`rate_limiter::try_acquire()`, window has room", rl + "rate_limiter_try_acquire_free",
         rl + "semaphore_uncontended", "one nested `co_await`", rl + "nested_co_await"),
        ("`token_bucket::acquire()`, tokens there", rl + "token_bucket_acquire_free",
         rl + "semaphore_uncontended", "one nested `co_await`", rl + "nested_co_await"),
        ("`keyed_semaphore`, int key", kb + "keyed_uncontended<int>",
         kb + "semaphore_uncontended", "—", None),
        ("`keyed_semaphore`, string key", kb + "keyed_uncontended<std::string>",
         kb + "semaphore_uncontended", "—", None),
        ("`keyed_semaphore::try_acquire`, int key", kb + "keyed_try<int>",
         kb + "semaphore_uncontended", "—", None),
        ("`single_flight`, 16 callers of one key (per caller)", kb + "single_flight_hit/16",
         kb + "semaphore_uncontended", "each caller calls (per call)", kb + "direct_call/16"),
        ("`shared_semaphore` uncontended", ss + "shared_semaphore_uncontended",
         ss + "semaphore_uncontended", "`std::counting_semaphore`",
         ss + "counting_semaphore_uncontended"),
        ("`shared_semaphore::try_acquire`", ss + "shared_semaphore_try_acquire",
         ss + "semaphore_uncontended", "`std::counting_semaphore`",
         ss + "counting_semaphore_uncontended"),
        ("`shared_semaphore` of 1, 2 threads (per acquire, wall; FIFO hand-off)",
         ss + "shared_semaphore_contended_2_threads/real_time", ss + "semaphore_uncontended",
         "`std::counting_semaphore` (barging)",
         ss + "counting_semaphore_contended_2_threads/real_time"),
        ("`redis::semaphore` acquire + release, loopback (wall)",
         rb + "BM_redis_semaphore_acquire_release/real_time",
         rb + "BM_local_semaphore_acquire_release/real_time", "one `PING` round trip",
         rb + "BM_redis_ping_round_trip/real_time"),
        ("`redis::rate_limiter` acquire, loopback (wall)",
         rb + "BM_redis_rate_limiter_acquire/real_time",
         rb + "BM_local_semaphore_acquire_release/real_time", "one `PING` round trip",
         rb + "BM_redis_ping_round_trip/real_time"),
    ]
    for label, ours, sem, peer_label, peer in rows:
        a, m, b = t.get(ours), t.get(sem), t.get(peer) if peer else None
        out.append(f"| {label} | {fmt_ns(a)} | "
                   f"{'—' if a is None or m is None else f'{a / m:.2f}x'} | {peer_label} | "
                   f"{fmt_ns(b)} | {'—' if a is None or b is None else f'{a / b:.2f}x'} |")
    if not any(k.startswith(rb) for k in t):
        out += ["", "(`redis_bench` reports itself skipped where `redis-server` cannot start.)"]
    return out


def stats_table(t):
    """What keeping stats() costs: each path with stats beside the floor of
    the same binary (the cost before stats existed needs the headers of the
    commit before them: docs/operating.md, "What stats cost")."""
    sb = "stats_bench:"
    rows = [
        ("floor: `co_await` of a trivial awaitable", "nested_co_await"),
        ("`semaphore`: `co_await acquire(); release();` (one increment)",
         "semaphore_acquire_release"),
        ("`semaphore`: `co_await scoped_acquire()` + the permit's release (1-in-16 hold sample)",
         "semaphore_scoped"),
        ("`lock`: `co_await scoped_acquire()` + the guard's release", "lock_scoped"),
        ("`shared_semaphore`: `co_await acquire(); release();` (relaxed atomics)",
         "shared_semaphore_acquire_release"),
        ("`shared_semaphore`: `co_await scoped_acquire()` + the permit's release",
         "shared_semaphore_scoped"),
        ("one `steady_clock::now()` (a timed hold reads two)", "steady_clock_now"),
        ("one duration into the log buckets", "recorder_record"),
        ("`semaphore::stats()` read (O(buckets))", "semaphore_stats_read"),
    ]
    if not any(sb + case in t for _, case in rows):
        return []
    load = t.get(sb + "load_avg")
    out = ["", "**What stats cost** (`benchmarks/stats_bench.cpp`; CPU ns per iteration with "
           "stats kept, × the floor of the same binary, heap allocations per iteration"
           + (f"; load average {load:.1f} during its run" if load is not None else "") + ")", "",
           "| path | ns | × floor | allocations |", "|---|---|---|---|"]
    floor = t.get(sb + "nested_co_await")
    for label, case in rows:
        v, a = t.get(sb + case), t.get(sb + case + "/allocs")
        out.append(f"| {label} | {fmt_ns(v)} | "
                   f"{'—' if v is None or not floor else f'{v / floor:.2f}x'} | "
                   f"{'—' if a is None else f'{a:.2f}'} |")
    return out


# ---------------------------------------------------------------- plots

STYLE = {
    "sequential": ("one after another", "tab:gray", "-"),
    "batches": ("fixed batches of limit", "tab:red", "-"),
    "cospawn_semaphore": ("co_spawn per task + semaphore", "tab:orange", "-"),
    "gather_with_concurrency": ("sluice::gather_with_concurrency", "tab:blue", "-"),
    "map_unordered": ("sluice::map_unordered", "tab:cyan", "--"),
    "ideal": ("ideal greedy schedule", "black", ":"),
}


def plot_makespan(study, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scenarios = [("amenity", "14 calls of 1–5 s"), ("calls200", "200 calls of 50–500 ms")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    xs = list(range(len(LIMITS)))
    labels = [str(l) if l else "∞" for l in LIMITS]
    for ax, (sc, title) in zip(axes, scenarios):
        rows = [r for r in study if r["scenario"] == sc]
        ideal = {r["limit"]: r["ideal_s"] for r in rows
                 if r["strategy"] == "gather_with_concurrency" and r["clock"] == "virtual"
                 and r["language"] == "C++"}
        for lang, clock, marker, alpha in [("C++", "virtual", "o", 1.0), ("C++", "real", "x", 0.7),
                                           ("Python asyncio", "real", "^", 0.7)]:
            for strategy, (label, color, ls) in STYLE.items():
                if strategy == "ideal":
                    continue
                pts = {r["limit"]: r["makespan_s"] for r in rows if r["language"] == lang and
                       r["clock"] == clock and r["strategy"] == strategy}
                if not pts:
                    continue
                if strategy == "sequential":
                    pts = {l: pts[1] for l in LIMITS}
                ys = [pts.get(l) for l in LIMITS]
                name = label if lang == "C++" else {
                    "batches": "asyncio.gather in chunks",
                    "gather_with_concurrency": "asyncio: the seeds' gather_with_concurrency",
                    "sequential": "asyncio: one after another"}[strategy]
                name += " (virtual time)" if clock == "virtual" else " (real time)"
                if clock == "virtual":
                    ax.plot(xs, ys, marker=marker, ls=ls, color=color, label=name)
                else:
                    ax.plot(xs, ys, marker=marker, ls="none", color=color, alpha=alpha,
                            label=name if strategy in ("batches", "gather_with_concurrency") else None)
        ax.plot(xs, [ideal.get(l) for l in LIMITS], ls=":", color="black", lw=2,
                label="ideal greedy schedule")
        ax.set_yscale("log")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("limit (calls in flight)")
        ax.set_ylabel("makespan (s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Makespan vs limit on the simulated slow service "
                 "(lines: virtual time, exact; x / ▲: real time scaled 1/100, C++ / asyncio)")
    fig.tight_layout(rect=(0, 0.17, 1, 0.96))
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"makespan.{ext}"), dpi=110)
    plt.close(fig)


def plot_ns(t, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = [
        ("gather_with_concurrency(100), 10k tasks",
         [("sluice, lazy input", "gwc_lazy/{k}/100", "sluice"),
          ("sluice, vector input", "gwc_vector/{k}/100", "sluice"),
          ("Asio: 100 workers, shared index", "pool_lazy/{k}/100", "asio"),
          ("lazy floor", "floor_lazy/{k}/10000", "floor"),
          ("co_spawn per task + semaphore(8)", "cospawn_semaphore/{k}/8", "asio"),
          ("asyncio gather_with_concurrency(100)", "asyncio_gwc/{k}/100", "asyncio")]),
        ("unbounded gather, 100k tasks",
         [("sluice gather, lazy", "gather_lazy/{k}/100000", "sluice"),
          ("sluice gather, vector", "gather_vector/{k}/100000", "sluice"),
          ("Asio: co_spawn + counter", "cospawn_counter_lazy/{k}/100000", "asio"),
          ("asyncio.gather (10k)", "asyncio_gather/{k}/10000", "asyncio")]),
        ("two tasks",
         [("sluice gather(a, b)", "pair_gather/{k}/2", "sluice"),
          ("Asio a && b", "pair_operators/{k}/2", "asio"),
          ("Asio parallel_group", "pair_parallel_group/{k}/2", "asio")]),
        ("map_unordered(64), 10k inputs",
         [("sluice map_unordered + for_each", "map_unordered_for_each/{k}/64", "sluice"),
          ("sluice map_unordered, next() loop", "map_unordered/{k}/64", "sluice"),
          ("Asio: workers + channel", "mu_channel_pool/{k}/64", "asio"),
          ("lazy floor", "mu_floor_lazy/{k}/64", "floor"),
          ("asyncio wait(FIRST_COMPLETED)", "asyncio_map_unordered/{k}/64", "asyncio")]),
        ("make bench-peers, limit 100",
         [("sluice gather_with_concurrency", "peers:sluice/fanout/{k}", "sluice"),
          ("sluice, io_context UNSAFE hint", "peers:sluice_unsafe/fanout/{k}", "sluice"),
          ("Asio floor", "peers:floor/fanout/{k}", "floor"),
          ("Go errgroup SetLimit (P=1)", "peers:go/fanout/{k}", "peer"),
          ("tokio buffered(100)", "peers:tokio/fanout/{k}", "peer"),
          ("asyncio semaphore + create_task", "peers:asyncio/fanout/{k}", "asyncio"),
          ("Trio CapacityLimiter + nursery", "peers:trio/fanout/{k}", "asyncio")]),
    ]
    colors = {"sluice": "tab:blue", "asio": "tab:orange", "floor": "tab:gray",
              "asyncio": "tab:green", "peer": "tab:purple"}
    rows, y = [], 0  # (y, label, key, category), one row per workload present in either kind
    for gname, items in groups:
        for label, key, cat in items:
            if any(key.format(k=k) in t for k in ("immediate", "suspending")):
                rows.append((y, f"{label}  [{gname}]", key, cat))
                y += 1
        y += 0.6
    fig, axes = plt.subplots(1, 2, figsize=(13, 9.5))
    for i, (ax, k) in enumerate(zip(axes, ("immediate", "suspending"))):
        shown = [(yy, t[key.format(k=k)], colors[cat]) for yy, _, key, cat in rows
                 if key.format(k=k) in t]
        ax.barh([r[0] for r in shown], [r[1] for r in shown], color=[r[2] for r in shown])
        for yy, v, _ in shown:
            ax.text(v * 1.05, yy, f"{v:.0f}", va="center", fontsize=7)
        ax.set_xscale("log")
        ax.set_yticks([r[0] for r in rows], [r[1] for r in rows] if i == 0 else [], fontsize=7)
        ax.set_ylim(y - 0.4, -0.8)
        ax.set_xlabel("ns per task (log scale)")
        ax.set_title(f"tasks {'completing at once' if k == 'immediate' else 'suspending once'}")
        ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.suptitle("Per-task cost: sluice (blue), Asio peers (orange), floor (gray), "
                 "Go and tokio (purple), Python asyncio and Trio (green)")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"ns_per_task.{ext}"), dpi=110)
    plt.close(fig)


def headline(t, target_rows):
    """The README's few lines: the same numbers as the tables, fewer of them."""
    measured = {r["target"]: r["measured"] for r in target_rows}

    def x(a, b):
        r = ratio(t, a, b)
        return "—" if r is None else f"{r:.2f}x"

    def faster(base):
        return measured.get(f"≥ {base}, immediate") or "—"

    rows = [
        ("`gather_with_concurrency(100, tasks)`, 10,000 tasks that complete at once",
         fmt_ns(t.get("gwc_lazy/immediate/100")),
         f"{x('gwc_lazy/immediate/100', 'floor_lazy/immediate/10000')} the lazy floor "
         f"(`for (i) co_await task(i)`), {x('gwc_lazy/immediate/100', 'pool_lazy/immediate/100')} "
         "a hand-written pool of Asio workers"),
        ("the same at limit 8", fmt_ns(t.get("gwc_lazy/immediate/8")),
         f"{faster('8x faster than `co_spawn` + semaphore (limit 8)')} than one `co_spawn` per "
         f"task behind a semaphore, {faster('200x faster than asyncio `gather_with_concurrency(8)`')}"
         " than asyncio's `gather_with_concurrency(8)`"),
        ("`for_each(map_unordered(fn, inputs, 64), body)`",
         fmt_ns(t.get("map_unordered_for_each/immediate/64")),
         f"{x('map_unordered_for_each/immediate/64', 'mu_floor_lazy/immediate/64')} the lazy floor"),
        ("uncontended `semaphore` acquire + release", fmt_ns(t.get("semaphore_uncontended")),
         f"{x('semaphore_uncontended', 'nested_co_await')} one nested `co_await`"),
        ("contended `semaphore` hand-off", fmt_ns(t.get("semaphore_handoff")),
         f"{x('semaphore_handoff', 'channel_handoff')} an `asio::experimental::channel` ping-pong"),
    ]
    out = ["| workload | ns | compared with |", "|---|---|---|"]
    out += [f"| {w} | {ns} | {c} |" for w, ns, c in rows]
    return "\n".join(out) + "\n"


def rewrite_block(path, block, begin="<!-- bench:begin -->", end="<!-- bench:end -->"):
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        sys.exit(f"{path}: no {begin} ... {end} block")
    pre, rest = text.split(begin, 1)
    _, post = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(pre + begin + "\n" + block + end + post)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build/bench")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--min-time", default="0.1")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--boost-build", help="a Boost.Asio build of the benchmarks (the peers "
                    "whose availability or cost depends on the Asio version run there too)")
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--docs")
    ap.add_argument("--page", help="the page whose bench:begin/end block gets the tables")
    ap.add_argument("--readme", help="the file whose bench-headline:begin/end block gets the headline")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if not a.no_run:
        run_benchmarks(a.build, a.out, a.min_time, a.repetitions)
        if a.boost_build:
            run_benchmarks(a.boost_build, a.out, a.min_time, a.repetitions, "boost_", BOOST_FILTER)
    t, study, context = collect(a.out)
    target_rows = targets(t, study)
    report = dict(context=context, timings=t, study=study, targets=target_rows)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    block = markdown(t, study, target_rows)
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        f.write(block)
    plot_makespan(study, a.out)
    plot_ns(t, a.out)
    print(block)
    print(f"report: {a.out}/report.json, {a.out}/tables.md, "
          f"{a.out}/makespan.{{png,svg}}, {a.out}/ns_per_task.{{png,svg}}")
    if a.docs:
        os.makedirs(a.docs, exist_ok=True)
        for name in ("makespan", "ns_per_task"):
            for ext in ("png", "svg"):
                shutil.copy(os.path.join(a.out, f"{name}.{ext}"), a.docs)
    if a.page:
        rewrite_block(a.page, block)
    if a.readme:
        rewrite_block(a.readme, headline(t, target_rows), "<!-- bench-headline:begin -->",
                      "<!-- bench-headline:end -->")


if __name__ == "__main__":
    main()
