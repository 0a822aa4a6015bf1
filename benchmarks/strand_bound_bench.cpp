// SPDX-License-Identifier: BSL-1.0
// The cost of sluice::strand_bound<semaphore> (a loop-affine limit on a strand
// of its own, callable from any strand) beside sluice::shared_semaphore (the
// lock-free thread-safe count) and the bare loop-affine semaphore:
//
//   semaphore_uncontended              bare semaphore, its one caller on its loop
//   shared_semaphore_uncontended       shared_semaphore, the same caller
//   strand_bound_uncontended           strand_bound<semaphore>, the caller on another
//                                      strand of the same 1-thread io_context: two hops
//                                      per acquire (there and back) + the release's post
//   strand_bound_on_its_strand         the caller on the limit's own strand: no hop
//   *_server_64_sessions_4_threads     the server shape: io_context run by 4 threads,
//                                      64 sessions each looping acquire / post / release
//                                      on one limit of 4; `per_acquire` is wall time per
//                                      acquisition. `semaphore_one_strand_...` is the
//                                      loop-affine way: every session on ONE strand.
//
// `make bench` runs it; alone: build/bench/benchmarks/strand_bound_bench.

#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/strand_bound.hpp>

#include <support/asio.hpp>
#include <support/bench_coroutine.hpp>

#include <benchmark/benchmark.h>

#include <exception>
#include <thread>
#include <vector>

namespace {

using sluice_bench::nested_co_await;
using sluice_bench::rethrow;
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

void shared_semaphore_uncontended(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::shared_semaphore sem{1};
    for (auto _ : s) {
      co_await sem.acquire();
      sem.release();
    }
  });
}
BENCHMARK(shared_semaphore_uncontended);

void strand_bound_uncontended(benchmark::State& state) {
  asio::io_context ctx(1);
  sluice::strand_bound<sluice::semaphore> sem{asio::make_strand(ctx), 1};
  asio::co_spawn(
      asio::make_strand(ctx),
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          co_await sem.acquire();
          sem.release();
        }
      },
      rethrow);
  ctx.run();
}
BENCHMARK(strand_bound_uncontended);

void strand_bound_on_its_strand(benchmark::State& state) {
  asio::io_context ctx(1);
  auto strand = asio::make_strand(ctx);
  sluice::strand_bound<sluice::semaphore> sem{strand, 1};
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          co_await sem.acquire();
          sem.release();
        }
      },
      rethrow);
  ctx.run();
}
BENCHMARK(strand_bound_on_its_strand);

constexpr int sessions = 64, rounds = 200, threads = 4, cap = 4;

asio::awaitable<void> yield() {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
}

// Runs `ctx` on `threads` threads until it runs out of work.
void run_threads(asio::io_context& ctx) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back([&] { ctx.run(); });
  ctx.run();
  for (auto& t : pool) t.join();
}

void per_acquire(benchmark::State& state) {
  state.counters["per_acquire"] =
      benchmark::Counter(double(sessions) * rounds * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Each session: `rounds` times acquire, one post (the work), release.
template <class Limit>
asio::awaitable<void> session(Limit& limit) {
  for (int i = 0; i < rounds; ++i) {
    co_await limit.acquire();
    co_await yield();
    limit.release();
  }
}

void semaphore_one_strand_server_64_sessions_4_threads(benchmark::State& state) {
  for (auto _ : state) {
    asio::io_context ctx(threads);
    auto strand = asio::make_strand(ctx);
    sluice::semaphore sem{strand, cap};
    for (int i = 0; i < sessions; ++i) asio::co_spawn(strand, session(sem), rethrow);
    run_threads(ctx);
  }
  per_acquire(state);
}
BENCHMARK(semaphore_one_strand_server_64_sessions_4_threads)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void shared_semaphore_server_64_sessions_4_threads(benchmark::State& state) {
  for (auto _ : state) {
    asio::io_context ctx(threads);
    sluice::shared_semaphore sem{cap};
    for (int i = 0; i < sessions; ++i)
      asio::co_spawn(asio::make_strand(ctx), session(sem), rethrow);
    run_threads(ctx);
  }
  per_acquire(state);
}
BENCHMARK(shared_semaphore_server_64_sessions_4_threads)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void strand_bound_server_64_sessions_4_threads(benchmark::State& state) {
  for (auto _ : state) {
    asio::io_context ctx(threads);
    sluice::strand_bound<sluice::semaphore> sem{asio::make_strand(ctx), cap};
    for (int i = 0; i < sessions; ++i)
      asio::co_spawn(asio::make_strand(ctx), session(sem), rethrow);
    run_threads(ctx);
  }
  per_acquire(state);
}
BENCHMARK(strand_bound_server_64_sessions_4_threads)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
