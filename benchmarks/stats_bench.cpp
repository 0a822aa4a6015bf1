// SPDX-License-Identifier: BSL-1.0
// What keeping stats() costs, each case beside the plain acquire it adds to:
//
//   nested_co_await               co_await of a trivial awaitable (the floor)
//   semaphore_acquire_release     co_await sem.acquire(); sem.release();
//                                 (stats: one counter increment per grant)
//   semaphore_scoped              co_await sem.scoped_acquire() and the permit's release
//                                 (stats: also the hold: two clock reads and a bucket)
//   lock_scoped                   the same on sluice::lock (a guard)
//   shared_semaphore_acquire_release / shared_semaphore_scoped
//                                 the same on the thread-safe semaphore (relaxed atomics)
//   steady_clock_now              one std::chrono::steady_clock::now() (what a hold reads twice)
//   recorder_record               one duration into the log buckets
//   semaphore_stats_read          sem.stats() (O(buckets): 368 buckets, two histograms)
//
// Every case also counts heap allocations per iteration (`allocs`): 0 once
// warm, i.e. nothing is allocated per acquisition. The cost before stats
// existed is measured by building this file with -DSLUICE_BENCH_BASELINE
// (the cases that need no stats API) against the headers of the commit
// before them (see docs/operating.md, "What stats cost").
#define SLUICE_BENCH_COUNT_ALLOCATIONS
#include "bench_common.hpp"

#include <sluice/lock.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#ifndef SLUICE_BENCH_BASELINE
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/stats.hpp>
#endif

#include <support/asio.hpp>
#include <support/bench_coroutine.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>

namespace {

using sluice_bench::run_coroutine;

// Allocations per iteration, counted over the timed loop.
struct allocation_meter {
  explicit allocation_meter(benchmark::State& s)
      : state(s), start(sluice_bench::allocations.load(std::memory_order_relaxed)) {}
  ~allocation_meter() {
    const long n = sluice_bench::allocations.load(std::memory_order_relaxed) - start;
    state.counters["allocs"] = static_cast<double>(n) / static_cast<double>(state.iterations());
  }
  benchmark::State& state;
  long start;
};

void nested_co_await(benchmark::State& state) {
  sluice_bench::nested_co_await(state);
}
BENCHMARK(nested_co_await);

void semaphore_acquire_release(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::semaphore sem{1};
    allocation_meter m(s);
    for (auto _ : s) {
      co_await sem.acquire();
      sem.release();
    }
  });
}
BENCHMARK(semaphore_acquire_release);

void semaphore_scoped(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::semaphore sem{1};
    { auto warm = co_await sem.scoped_acquire(); }  // the buckets are allocated once, here
    allocation_meter m(s);
    for (auto _ : s) {
      auto permit = co_await sem.scoped_acquire();
    }
  });
}
BENCHMARK(semaphore_scoped);

void lock_scoped(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::lock l;
    { auto warm = co_await l.scoped_acquire(); }
    allocation_meter m(s);
    for (auto _ : s) {
      auto guard = co_await l.scoped_acquire();
    }
  });
}
BENCHMARK(lock_scoped);

void shared_semaphore_acquire_release(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::shared_semaphore sem{1};
    allocation_meter m(s);
    for (auto _ : s) {
      co_await sem.acquire();
      sem.release();
    }
  });
}
BENCHMARK(shared_semaphore_acquire_release);

void shared_semaphore_scoped(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::shared_semaphore sem{1};
    { auto warm = co_await sem.scoped_acquire(); }
    allocation_meter m(s);
    for (auto _ : s) {
      auto permit = co_await sem.scoped_acquire();
    }
  });
}
BENCHMARK(shared_semaphore_scoped);

#ifndef SLUICE_BENCH_BASELINE
void steady_clock_now(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(steady_clock_now);

void recorder_record(benchmark::State& state) {
  sluice::detail::duration_recorder<false> r;
  std::int64_t ns = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ns);
    r.record(std::chrono::nanoseconds(ns));
    benchmark::ClobberMemory();
    ns = (ns * 7 + 3) & 0xffffff;  // spread over the buckets
  }
  benchmark::DoNotOptimize(r.count());
}
BENCHMARK(recorder_record);

void semaphore_stats_read(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::semaphore sem{1};
    for (int i = 0; i < 1000; ++i) {
      auto p = co_await sem.scoped_acquire();
    }
    allocation_meter m(s);
    for (auto _ : s) benchmark::DoNotOptimize(sem.stats());
  });
}
BENCHMARK(semaphore_stats_read);
#endif

}  // namespace

BENCHMARK_MAIN();
