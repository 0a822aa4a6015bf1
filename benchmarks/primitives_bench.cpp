// SPDX-License-Identifier: BSL-1.0
// The cost of sluice's synchronization primitives, each case beside the raw
// Asio baseline it is measured against, in the same process:
//
//   nested_co_await               co_await of a trivial awaitable (the floor)
//   semaphore_uncontended         co_await sem.acquire(); sem.release();   (target <= 2x floor)
//   lock_uncontended              the same on sluice::lock
//   post_round_trip               co_await asio::post(use_awaitable) (one trip through the loop)
//   semaphore_handoff             two coroutines ping-pong through two semaphores;
//                                 `per_handoff` is the time of one release -> waiter resumed
//                                 (target <= one post round trip)
//   channel_handoff               the same ping-pong through two unbuffered
//                                 asio::experimental::channel (the Asio peer)
//   queue_transfer                10,000 items through a sluice::queue of capacity 16, per item
//   channel_transfer              the same through an asio::experimental::channel (the peer)
//   event_set_wakes_100k          event::set() waking 100,000 waiters; `per_waiter`
//
// The same three measurements in Python asyncio: benchmarks/primitives_asyncio.py.
// `make bench` runs both.

#include "bench_common.hpp"

#include <sluice/event.hpp>
#include <sluice/lock.hpp>
#include <sluice/queue.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>
#include <support/bench_coroutine.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

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

void lock_uncontended(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::lock l;
    for (auto _ : s) {
      co_await l.acquire();
      l.release();
    }
  });
}
BENCHMARK(lock_uncontended);

void post_round_trip(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    for (auto _ : s) co_await asio::post(ex, asio::use_awaitable);
  });
  state.counters["per_post"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(post_round_trip);

void semaphore_handoff(benchmark::State& state) {
  asio::io_context ctx(1);
  sluice::semaphore ping{0}, pong{0};
  bool stop = false;
  // B: waits for ping, answers with pong.
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          co_await ping.acquire();
          if (stop) co_return;
          pong.release();
        }
      },
      rethrow);
  // A: drives the loop; each iteration is two hand-offs.
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          ping.release();
          co_await pong.acquire();
        }
        stop = true;
        ping.release();
      },
      rethrow);
  ctx.run();
  state.counters["per_handoff"] =
      benchmark::Counter(2.0 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(semaphore_handoff);

// The Asio peer of semaphore_handoff: the same ping-pong through two
// unbuffered asio::experimental::channel<void(error_code, int)> (Asio 1.22
// cannot instantiate a channel of void(error_code)).
void channel_handoff(benchmark::State& state) {
  asio::io_context ctx(1);
  using channel = asio::experimental::channel<void(sluice::error_code, int)>;
  channel ping(ctx, 0), pong(ctx, 0);
  bool stop = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          co_await ping.async_receive(asio::use_awaitable);
          if (stop) co_return;
          co_await pong.async_send(sluice::error_code{}, 0, asio::use_awaitable);
        }
      },
      rethrow);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          co_await ping.async_send(sluice::error_code{}, 0, asio::use_awaitable);
          co_await pong.async_receive(asio::use_awaitable);
        }
        stop = true;
        co_await ping.async_send(sluice::error_code{}, 0, asio::use_awaitable);
      },
      rethrow);
  ctx.run();
  state.counters["per_handoff"] =
      benchmark::Counter(2.0 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(channel_handoff);

constexpr std::size_t queue_items = 10'000;
constexpr std::size_t queue_capacity = 16;

// A producer puts 10,000 items through a queue of capacity 16 to a consumer;
// per item. `make(ctx)` returns a pointer to the queue; `put(q, i)` and
// `get(q)` return awaitables.
template <class Make, class Put, class Get>
void transfer(benchmark::State& state, Make make, Put put, Get get) {
  asio::io_context ctx(1);
  long sum = 0;
  for (auto _ : state) {
    auto q = make(ctx);
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          for (std::size_t i = 0; i < queue_items; ++i) co_await put(*q, static_cast<int>(i));
        },
        rethrow);
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          for (std::size_t i = 0; i < queue_items; ++i) sum += co_await get(*q);
        },
        rethrow);
    ctx.restart();
    ctx.run();
  }
  benchmark::DoNotOptimize(sum);
  state.counters["per_item"] =
      benchmark::Counter(static_cast<double>(queue_items * state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void queue_transfer(benchmark::State& state) {
  transfer(
      state, [](asio::io_context&) { return std::make_unique<sluice::queue<int>>(queue_capacity); },
      [](sluice::queue<int>& q, int i) { return q.put(i); },
      [](sluice::queue<int>& q) { return q.get(); });
}
BENCHMARK(queue_transfer);

// The Asio peer of queue_transfer: asio::experimental::channel of capacity 16.
void channel_transfer(benchmark::State& state) {
  using channel = asio::experimental::channel<void(sluice::error_code, int)>;
  transfer(
      state, [](asio::io_context& ctx) { return std::make_unique<channel>(ctx, queue_capacity); },
      [](channel& ch, int i) {
        return ch.async_send(sluice::error_code{}, i, asio::use_awaitable);
      },
      [](channel& ch) { return ch.async_receive(asio::use_awaitable); });
}
BENCHMARK(channel_transfer);

void event_set_wakes_100k(benchmark::State& state) {
  constexpr std::size_t waiters = 100'000;
  asio::io_context ctx(1);
  std::size_t woken = 0;
  for (auto _ : state) {
    state.PauseTiming();
    sluice::event ev;
    for (std::size_t i = 0; i < waiters; ++i) {
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            co_await ev.wait();
            ++woken;
          },
          rethrow);
    }
    ctx.restart();
    ctx.poll();  // every waiter is now parked on the event
    state.ResumeTiming();
    ev.set();
    ctx.restart();
    ctx.poll();  // every waiter resumed
  }
  if (woken != waiters * state.iterations()) state.SkipWithError("not every waiter woke");
  state.counters["per_waiter"] =
      benchmark::Counter(static_cast<double>(waiters * state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(event_set_wakes_100k)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
