// SPDX-License-Identifier: BSL-1.0
// Per-task overhead of sluice's fan-out, each case beside its baselines in the
// same process. Tasks complete immediately, so only the machinery is timed.
//
//   sequential_co_await          for (t : tasks) co_await t;          (the floor)
//   gather_with_concurrency/8    sluice, limit 8
//   cospawn_per_task_semaphore/8 the pattern users port from asyncio: one
//                                co_spawn per task behind a semaphore of 8
//   gather_unbounded             sluice::gather over the whole range
//   raw_cospawn_counter          hand-written: co_spawn each, count down, resume
//   real_time_makespan           30 calls of 20-100 ms on the real-time service, limit 5:
//                                worst makespan / ideal greedy schedule (target <= 1.05)
//   harness_virtual_calls        simulated slow calls through gather_with_concurrency
//                                on the virtual-time loop (calls/s)
//
// Ratios are in README.md; `make bench` reproduces them.

#include <sluice/detail/completion.hpp>
#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <queue>
#include <vector>

namespace {

constexpr std::size_t tasks_per_run = 10'000;

asio::awaitable<int> instant(int x) {
  co_return x + 1;
}

std::vector<asio::awaitable<int>> make_tasks(std::size_t n) {
  std::vector<asio::awaitable<int>> v;
  v.reserve(n);
  for (std::size_t i = 0; i < n; ++i) v.push_back(instant(static_cast<int>(i)));
  return v;
}

template <class Body>
void run_benchmark(benchmark::State& state, Body body) {
  asio::io_context ctx(1);
  for (auto _ : state) {
    asio::co_spawn(ctx, body(), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
    ctx.restart();
    ctx.run();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * tasks_per_run));
  state.counters["ns_per_task"] =
      benchmark::Counter(static_cast<double>(state.iterations() * tasks_per_run),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

asio::awaitable<void> await_each(std::vector<asio::awaitable<int>> tasks) {
  long sum = 0;
  for (auto& t : tasks) sum += co_await std::move(t);
  benchmark::DoNotOptimize(sum);
}

void sequential_co_await(benchmark::State& state) {
  run_benchmark(state,
                []() -> asio::awaitable<void> { co_await await_each(make_tasks(tasks_per_run)); });
}

void gather_with_concurrency(benchmark::State& state) {
  const auto limit = static_cast<std::size_t>(state.range(0));
  run_benchmark(state, [limit]() -> asio::awaitable<void> {
    auto r = co_await sluice::gather_with_concurrency(limit, make_tasks(tasks_per_run));
    benchmark::DoNotOptimize(r.data());
  });
}

// The minimal semaphore such ports hand-roll: a count and a FIFO of handlers.
struct naive_semaphore {
  std::size_t count;
  std::deque<sluice::detail::erased_handler<>> waiters;
  asio::awaitable<void> acquire() {
    if (count > 0) {
      --count;
      co_return;
    }
    auto ex = co_await asio::this_coro::executor;
    co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(
        [this, ex](auto h) { waiters.emplace_back(std::move(h), ex); }, asio::use_awaitable);
  }
  void release() {
    if (waiters.empty()) {
      ++count;
      return;
    }
    auto h = std::move(waiters.front());
    waiters.pop_front();
    h.complete();
  }
};

// Waits until `pending` drops to zero.
struct countdown {
  std::size_t pending;
  sluice::detail::erased_handler<> waiter;
  void done() {
    if (--pending == 0 && waiter) waiter.complete();
  }
  asio::awaitable<void> wait() {
    if (pending == 0) co_return;
    auto ex = co_await asio::this_coro::executor;
    co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(
        [this, ex](auto h) { waiter = sluice::detail::erased_handler<>(std::move(h), ex); },
        asio::use_awaitable);
  }
};

void cospawn_per_task_semaphore(benchmark::State& state) {
  const auto limit = static_cast<std::size_t>(state.range(0));
  run_benchmark(state, [limit]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    naive_semaphore sem{limit, {}};
    countdown left{tasks_per_run, {}};
    std::vector<int> results(tasks_per_run);
    auto tasks = make_tasks(tasks_per_run);
    for (std::size_t i = 0; i < tasks_per_run; ++i) {
      asio::co_spawn(
          ex,
          [&, i]() -> asio::awaitable<void> {
            co_await sem.acquire();
            results[i] = co_await std::move(tasks[i]);
            sem.release();
          },
          [&](std::exception_ptr) { left.done(); });
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
}

void gather_unbounded(benchmark::State& state) {
  run_benchmark(state, []() -> asio::awaitable<void> {
    auto r = co_await sluice::gather(make_tasks(tasks_per_run));
    benchmark::DoNotOptimize(r.data());
  });
}

void raw_cospawn_counter(benchmark::State& state) {
  run_benchmark(state, []() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    countdown left{tasks_per_run, {}};
    std::vector<int> results(tasks_per_run);
    auto tasks = make_tasks(tasks_per_run);
    for (std::size_t i = 0; i < tasks_per_run; ++i) {
      asio::co_spawn(ex, std::move(tasks[i]), [&, i](std::exception_ptr, int v) {
        results[i] = v;
        left.done();
      });
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
}

// One million simulated 1-5 s calls, 1000 at a time, in virtual time.
void harness_virtual_calls(benchmark::State& state) {
  const std::size_t calls = 1'000'000;
  for (auto _ : state) {
    sluice::testing::slow_service svc({.latency = sluice::testing::latency::uniform(
                                           std::chrono::seconds(1), std::chrono::seconds(5)),
                                       .record_timeline = false});
    sluice::testing::virtual_loop loop;
    loop.run([&]() -> asio::awaitable<void> {
      std::vector<asio::awaitable<void>> v;
      v.reserve(calls);
      for (std::size_t i = 0; i < calls; ++i) v.push_back(svc.call());
      co_await sluice::gather_with_concurrency(1000, std::move(v));
    });
    benchmark::DoNotOptimize(svc.completed());
    state.counters["virtual_s"] = std::chrono::duration<double>(loop.now()).count();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * calls));
}

// Bounded fan-out on the real-time simulated service: makespan against the
// ideal (greedy) schedule of the same latencies. Target: within 5%.
void real_time_makespan(benchmark::State& state) {
  const std::size_t n = 30, limit = 5;
  const auto model = sluice::testing::latency::uniform(std::chrono::milliseconds(20),
                                                       std::chrono::milliseconds(100), 3);
  std::priority_queue<std::chrono::nanoseconds, std::vector<std::chrono::nanoseconds>,
                      std::greater<>>
      free_at;
  for (std::size_t i = 0; i < limit; ++i) free_at.push(std::chrono::nanoseconds(0));
  std::chrono::nanoseconds ideal(0);
  for (std::size_t i = 0; i < n; ++i) {
    auto t = free_at.top() + model({i, "", ""});
    free_at.pop();
    free_at.push(t);
    ideal = std::max(ideal, t);
  }
  double worst = 0;
  for (auto _ : state) {
    sluice::testing::slow_service svc({.latency = model});
    asio::io_context ctx(1);
    const auto t0 = std::chrono::steady_clock::now();
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          std::vector<asio::awaitable<void>> v;
          for (std::size_t i = 0; i < n; ++i) v.push_back(svc.call());
          co_await sluice::gather_with_concurrency(limit, std::move(v));
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
    ctx.run();
    const auto took = std::chrono::steady_clock::now() - t0;
    worst =
        std::max(worst, std::chrono::duration<double>(took) / std::chrono::duration<double>(ideal));
  }
  state.counters["ideal_ms"] = std::chrono::duration<double, std::milli>(ideal).count();
  state.counters["worst_ratio"] = worst;
}

}  // namespace

BENCHMARK(sequential_co_await);
BENCHMARK(gather_with_concurrency)->Arg(1)->Arg(8)->Arg(64);
BENCHMARK(cospawn_per_task_semaphore)->Arg(8);
BENCHMARK(gather_unbounded);
BENCHMARK(raw_cospawn_counter);
BENCHMARK(real_time_makespan)->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(harness_virtual_calls)->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
