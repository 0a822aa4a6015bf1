// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_BENCH_LOOP_HPP
#define SLUICE_TESTS_SUPPORT_BENCH_LOOP_HPP

// Shared by the benchmarks: a coroutine that drives the benchmark loop itself
// on a fresh io_context, and the trivial awaitable of the nested_co_await
// floor.

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <exception>
#include <functional>

namespace sluice_bench {

inline void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

inline void run_coroutine(benchmark::State& state,
                          std::function<asio::awaitable<void>(benchmark::State&)> body) {
  asio::io_context ctx(1);
  asio::co_spawn(ctx, body(state), rethrow);
  ctx.run();
}

inline asio::awaitable<void> trivial() {
  co_return;
}

}  // namespace sluice_bench

#endif  // SLUICE_TESTS_SUPPORT_BENCH_LOOP_HPP
