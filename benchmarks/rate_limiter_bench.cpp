// SPDX-License-Identifier: BSL-1.0
// The cost of a time-based limiter when it lets the call through at once,
// beside the semaphore and the floor, in the same process (steady clock, an
// ordinary io_context: each acquire reads the clock once):
//
//   nested_co_await                co_await of a trivial awaitable (the floor)
//   semaphore_uncontended          co_await sem.acquire(); sem.release();
//   rate_limiter_acquire_free      co_await rl.acquire() with the window never full
//                                  (rate_limiter{1e9, 1ms}: it still records and
//                                  expires every start)
//   rate_limiter_try_acquire_free  rl.try_acquire(), no coroutine frame
//   token_bucket_acquire_free      co_await tb.acquire() with tokens always there
//                                  (token_bucket{1e9/s, 1e9})
//
// `make bench` runs it; alone: build/bench/benchmarks/rate_limiter_bench.

#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/token_bucket.hpp>

#include <support/asio.hpp>

#include <benchmark/benchmark.h>
#include <support/bench_coroutine.hpp>

#include <chrono>
#include <exception>
#include <functional>

namespace {

using sluice_bench::nested_co_await;
using sluice_bench::run_coroutine;

BENCHMARK(nested_co_await);

void semaphore_uncontended(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::semaphore sem{1};
    for (auto _ : s) {
      co_await sem.acquire();
      sem.release();
    }
  });
}
BENCHMARK(semaphore_uncontended);

void rate_limiter_acquire_free(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::rate_limiter rl{1'000'000'000, std::chrono::milliseconds(1)};
    for (auto _ : s) co_await rl.acquire();
  });
}
BENCHMARK(rate_limiter_acquire_free);

void rate_limiter_try_acquire_free(benchmark::State& state) {
  asio::io_context ctx(1);
  sluice::rate_limiter rl{ctx.get_executor(), 1'000'000'000, std::chrono::milliseconds(1)};
  for (auto _ : state) benchmark::DoNotOptimize(rl.try_acquire());
}
BENCHMARK(rate_limiter_try_acquire_free);

void token_bucket_acquire_free(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::token_bucket tb{1e9, 1'000'000'000};
    for (auto _ : s) co_await tb.acquire();
  });
}
BENCHMARK(token_bucket_acquire_free);

}  // namespace

BENCHMARK_MAIN();
