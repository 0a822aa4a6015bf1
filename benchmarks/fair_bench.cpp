// SPDX-License-Identifier: BSL-1.0
// Fair shares, each case beside its baseline (a FIFO semaphore) in the same process:
//
//   uncontended/<kind>   one coroutine: auto p = co_await x.scoped_acquire(key); (released at once)
//   contended/<kind>     64 coroutines over 8 keys share 4 permits; each takes a permit 16 times,
//                        holds it across one post and releases it: 1,024 grants per iteration,
//                        items/s = grants per second
//
// <kind>: semaphore (FIFO, the baseline), fair_semaphore<int> (the rotation built in),
// fair_limit<semaphore, int> (the gate in front of a semaphore). Run:
// build/<dir>/benchmarks/fair_bench

#include <sluice/fair_limit.hpp>
#include <sluice/fair_semaphore.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <exception>

namespace {

void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

struct fifo {
  sluice::semaphore sem;
  explicit fifo(std::size_t n) : sem(n) {}
  auto take(int) { return sem.scoped_acquire(); }
};
struct fair_sem {
  sluice::fair_semaphore<int> sem;
  explicit fair_sem(std::size_t n) : sem(n) {}
  auto take(int k) { return sem.scoped_acquire(k); }
};
struct fair_gate {
  sluice::fair_limit<sluice::semaphore, int> sem;
  explicit fair_gate(std::size_t n) : sem(n) {}
  auto take(int k) { return sem.scoped_acquire(k); }
};

template <class Kind>
void uncontended(benchmark::State& state) {
  asio::io_context ctx(1);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        Kind k{1};
        for (auto _ : state) {
          auto permit = co_await k.take(7);
          benchmark::DoNotOptimize(permit);
        }
      },
      rethrow);
  ctx.run();
}
BENCHMARK_TEMPLATE(uncontended, fifo);
BENCHMARK_TEMPLATE(uncontended, fair_sem);
BENCHMARK_TEMPLATE(uncontended, fair_gate);

template <class Kind>
asio::awaitable<void> worker(Kind& k, int key) {
  for (int i = 0; i < 16; ++i) {
    auto permit = co_await k.take(key);
    co_await asio::post(asio::use_awaitable);
  }
}

template <class Kind>
void contended(benchmark::State& state) {
  for (auto _ : state) {
    asio::io_context ctx(1);
    Kind k{4};
    for (int c = 0; c < 64; ++c) asio::co_spawn(ctx, worker(k, c % 8), rethrow);
    ctx.run();
  }
  state.SetItemsProcessed(state.iterations() * 1024);
}
BENCHMARK_TEMPLATE(contended, fifo);
BENCHMARK_TEMPLATE(contended, fair_sem);
BENCHMARK_TEMPLATE(contended, fair_gate);

}  // namespace

BENCHMARK_MAIN();
