// SPDX-License-Identifier: BSL-1.0
// The cost of sluice::shared_semaphore, the thread-safe cap, beside its
// baselines in the same process:
//
//   nested_co_await                      co_await of a trivial awaitable (the floor)
//   semaphore_uncontended                loop-affine sluice::semaphore: co_await acquire();
//   release() shared_semaphore_uncontended         the same on sluice::shared_semaphore
//   shared_semaphore_try_acquire         try_acquire() + release() from a plain thread (no
//   coroutine) counting_semaphore_uncontended       std::counting_semaphore acquire() + release(),
//   one thread shared_semaphore_contended_2_threads two threads, each running its own io_context
//   and one
//                                        coroutine looping co_await acquire(); release() on one
//                                        shared_semaphore{1}; `per_acquire` over both threads
//   counting_semaphore_contended_2_threads  two std::threads looping acquire(); release() on one
//                                        std::counting_semaphore{1}
//
// `make bench` runs it; alone: build/bench/benchmarks/shared_semaphore_bench.

#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>

#include <support/asio.hpp>
#include <support/bench_coroutine.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <semaphore>
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

void shared_semaphore_try_acquire(benchmark::State& state) {
  sluice::shared_semaphore sem{1};
  for (auto _ : state) {
    benchmark::DoNotOptimize(sem.try_acquire());
    sem.release();
  }
}
BENCHMARK(shared_semaphore_try_acquire);

void counting_semaphore_uncontended(benchmark::State& state) {
  std::counting_semaphore<> sem{1};
  for (auto _ : state) {
    sem.acquire();
    sem.release();
  }
}
BENCHMARK(counting_semaphore_uncontended);

constexpr int rounds = 20000;  // acquisitions per thread per benchmark iteration

void shared_semaphore_contended_2_threads(benchmark::State& state) {
  for (auto _ : state) {
    sluice::shared_semaphore sem{1};
    std::vector<asio::io_context> loops(2);
    for (auto& ctx : loops) {
      asio::co_spawn(
          ctx,
          [&sem]() -> asio::awaitable<void> {
            for (int i = 0; i < rounds; ++i) {
              co_await sem.acquire();
              sem.release();
            }
          },
          rethrow);
    }
    std::thread other([&] { loops[1].run(); });
    loops[0].run();
    other.join();
  }
  state.counters["per_acquire"] =
      benchmark::Counter(2.0 * rounds * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(shared_semaphore_contended_2_threads)->UseRealTime()->Unit(benchmark::kMillisecond);

void counting_semaphore_contended_2_threads(benchmark::State& state) {
  for (auto _ : state) {
    std::counting_semaphore<> sem{1};
    auto loop = [&sem] {
      for (int i = 0; i < rounds; ++i) {
        sem.acquire();
        sem.release();
      }
    };
    std::thread other(loop);
    loop();
    other.join();
  }
  state.counters["per_acquire"] =
      benchmark::Counter(2.0 * rounds * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(counting_semaphore_contended_2_threads)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
