// SPDX-License-Identifier: BSL-1.0
// Uncontended cluster-wide acquire + release over loopback, beside its
// baselines: one PING round trip on the same connection (the floor: an
// acquire is one script round trip, the release is pipelined) and the
// process-local sluice::semaphore. Starts its own redis-server.
//
//   build/bench/benchmarks/redis_bench --benchmark_min_time=0.5
#include <sluice/redis/rate_limiter.hpp>
#include <sluice/redis/semaphore.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <optional>

using namespace std::chrono_literals;

namespace {

struct fixture {
  std::optional<sluice_test::redis_server> server = sluice_test::redis_server::start();
  asio::io_context ctx;
  std::shared_ptr<sluice::redis::connection> conn;
  fixture() {
    if (server) conn = sluice_test::run_for(ctx, sluice_test::connect_to(server->port()));
  }
};

fixture& shared() {
  static fixture f;
  return f;
}

// Runs one awaitable to completion on the fixture's loop (run() would not
// return: the connection always has a read outstanding).
template <class F>
void run_once(fixture& f, F make) {
  bool done = false;
  asio::co_spawn(f.ctx, make(), [&](std::exception_ptr e) {
    done = true;
    if (e) std::rethrow_exception(e);
  });
  f.ctx.restart();
  while (!done) f.ctx.run_one();
}

void BM_redis_ping_round_trip(benchmark::State& state) {
  auto& f = shared();
  if (!f.conn) return state.SkipWithError("no redis-server");
  for (auto _ : state) {
    run_once(f, [&]() -> asio::awaitable<void> { co_await f.conn->execute("PING"); });
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_redis_ping_round_trip)->UseRealTime();

void BM_redis_semaphore_acquire_release(benchmark::State& state) {
  auto& f = shared();
  if (!f.conn) return state.SkipWithError("no redis-server");
  sluice::redis::semaphore sem{f.conn, "bench", 5, 2s};
  // A fresh server holds back grants for one renewal interval + a margin after it starts
  // (restart safety): the first acquire waits that out, outside the timing.
  run_once(f, [&]() -> asio::awaitable<void> {
    co_await sem.acquire();
    sem.release();
  });
  for (auto _ : state) {
    run_once(f, [&]() -> asio::awaitable<void> {
      co_await sem.acquire();
      sem.release();
    });
  }
  run_once(f, [&]() -> asio::awaitable<void> { co_await sem.close(); });
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_redis_semaphore_acquire_release)->UseRealTime();

void BM_redis_rate_limiter_acquire(benchmark::State& state) {
  auto& f = shared();
  if (!f.conn) return state.SkipWithError("no redis-server");
  sluice::redis::rate_limiter rl{f.conn, "bench", 1000000000, 1s};
  for (auto _ : state) {
    run_once(f, [&]() -> asio::awaitable<void> { co_await rl.acquire(); });
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_redis_rate_limiter_acquire)->UseRealTime();

void BM_local_semaphore_acquire_release(benchmark::State& state) {
  auto& f = shared();
  sluice::semaphore sem{5};
  for (auto _ : state) {
    run_once(f, [&]() -> asio::awaitable<void> {
      co_await sem.acquire();
      sem.release();
    });
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_local_semaphore_acquire_release)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
