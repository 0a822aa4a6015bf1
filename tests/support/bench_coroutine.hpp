// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_BENCH_COROUTINE_HPP
#define SLUICE_TESTS_SUPPORT_BENCH_COROUTINE_HPP

// Benchmark helpers: one coroutine that drives a Google Benchmark loop on a
// fresh single-threaded io_context, and the floor every primitive is measured
// against (a nested co_await of a trivial awaitable).

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <exception>
#include <functional>

namespace sluice_bench {

inline void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

// Runs `body(state)` as one coroutine on a fresh io_context; the coroutine
// drives the benchmark loop itself.
inline void run_coroutine(benchmark::State& state,
                          std::function<asio::awaitable<void>(benchmark::State&)> body) {
  asio::io_context ctx(1);
  asio::co_spawn(ctx, body(state), rethrow);
  ctx.run();
}

inline asio::awaitable<void> trivial() {
  co_return;
}

// The floor: co_await of a trivial awaitable.
inline void nested_co_await(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    for (auto _ : s) co_await trivial();
  });
}

}  // namespace sluice_bench

#endif  // SLUICE_TESTS_SUPPORT_BENCH_COROUTINE_HPP
