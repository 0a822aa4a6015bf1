// SPDX-License-Identifier: BSL-1.0
// Per-task cost of sluice's fan-out, each case beside its baselines in the same
// process, with both task kinds (completing at once; suspending once through a
// post). Every name is <workload>/<task kind>/<limit or N>; the counter
// ns_per_task is what `make bench`'s report reads.
//
//   floor_lazy            for (i < N) co_await task(i);  a frame made and awaited at
//                         once: the floor every table is based on
//   floor_vector          the same over a vector of pre-made awaitables (N frames up front)
//   gwc_lazy / gwc_vector sluice::gather_with_concurrency(limit, tasks), lazy / vector input
//   pool_lazy / pool_vector  hand-written: `limit` co_spawned Asio workers pulling a
//                         shared index (the baseline for gather_with_concurrency)
//   cospawn_semaphore     one co_spawn per task behind a naive semaphore of `limit`
//                         (asyncio's pattern ported literally)
//   gather_lazy / gather_vector  sluice::gather, unbounded, N tasks
//   cospawn_counter_lazy / cospawn_counter_vector  hand-written: co_spawn each, count down
//   cospawn_cancellable_lazy  the same with each task bound to its own cancellation
//                         signal (what gather must pay to cancel its children)
//   parallel_group_ranged asio::experimental::make_parallel_group(range).async_wait(
//                         wait_for_all()) (Asio >= 1.24 only)
//   pair_gather           co_await sluice::gather(a, b), per task
//   pair_operators        co_await (a && b), asio::experimental::awaitable_operators
//   pair_parallel_group   make_parallel_group(co_spawn(a), co_spawn(b)).async_wait(
//                         wait_for_all())  (the variadic form, Asio 1.22)
//   harness_virtual_calls one million simulated 1-5 s calls through
//                         gather_with_concurrency(1000) in virtual time (calls/s)

// Heap allocations per task are counted too (counter allocs_per_task).
#define SLUICE_BENCH_COUNT_ALLOCATIONS
#include "bench_common.hpp"

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

namespace {

using namespace sluice_bench;
using namespace asio::experimental::awaitable_operators;

constexpr std::size_t tasks_per_run = 10'000;

template <kind K>
void floor_lazy(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    long sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += co_await task<K>(static_cast<int>(i));
    benchmark::DoNotOptimize(sum);
  });
  per_task(state, n, K);
}

template <kind K>
void floor_vector(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    auto tasks = vector_tasks<K>(n);
    long sum = 0;
    for (auto& t : tasks) sum += co_await std::move(t);
    benchmark::DoNotOptimize(sum);
  });
  per_task(state, n, K);
}

template <kind K, bool Lazy>
void gwc(benchmark::State& state, std::size_t limit) {
  run_each_iteration(state, [limit]() -> asio::awaitable<void> {
    if constexpr (Lazy) {
      auto r = co_await sluice::gather_with_concurrency(limit, lazy_tasks<K>(tasks_per_run));
      benchmark::DoNotOptimize(r.data());
    } else {
      auto r = co_await sluice::gather_with_concurrency(limit, vector_tasks<K>(tasks_per_run));
      benchmark::DoNotOptimize(r.data());
    }
  });
  per_task(state, tasks_per_run, K);
}

// `limit` workers, each co_spawned, pulling the next index until none is left.
template <kind K, bool Lazy>
void pool(benchmark::State& state, std::size_t limit) {
  run_each_iteration(state, [limit]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    const std::size_t n = tasks_per_run, workers = std::min(limit, n);
    std::vector<int> results(n);
    std::vector<asio::awaitable<int>> tasks;
    if constexpr (!Lazy) tasks = vector_tasks<K>(n);
    std::size_t next = 0;
    countdown left{workers, {}};
    for (std::size_t w = 0; w < workers; ++w) {
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            for (std::size_t i; (i = next++) < n;) {
              if constexpr (Lazy)
                results[i] = co_await task<K>(static_cast<int>(i));
              else
                results[i] = co_await std::move(tasks[i]);
            }
          },
          [&](std::exception_ptr) { left.done(); });
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
  per_task(state, tasks_per_run, K);
}

template <kind K>
void cospawn_semaphore(benchmark::State& state, std::size_t limit) {
  run_each_iteration(state, [limit]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    naive_semaphore sem{limit, {}};
    countdown left{tasks_per_run, {}};
    std::vector<int> results(tasks_per_run);
    for (std::size_t i = 0; i < tasks_per_run; ++i) {
      asio::co_spawn(
          ex,
          [&, i]() -> asio::awaitable<void> {
            co_await sem.acquire();
            results[i] = co_await task<K>(static_cast<int>(i));
            sem.release();
          },
          [&](std::exception_ptr) { left.done(); });
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
  per_task(state, tasks_per_run, K);
}

template <kind K, bool Lazy>
void gather_unbounded(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    if constexpr (Lazy) {
      auto r = co_await sluice::gather(lazy_tasks<K>(n));
      benchmark::DoNotOptimize(r.data());
    } else {
      auto r = co_await sluice::gather(vector_tasks<K>(n));
      benchmark::DoNotOptimize(r.data());
    }
  });
  per_task(state, n, K);
}

template <kind K, bool Lazy>
void cospawn_counter(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    countdown left{n, {}};
    std::vector<int> results(n);
    std::vector<asio::awaitable<int>> tasks;
    if constexpr (!Lazy) tasks = vector_tasks<K>(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto t = Lazy ? task<K>(static_cast<int>(i)) : std::move(tasks[i]);
      asio::co_spawn(ex, std::move(t), [&, i](std::exception_ptr, int v) {
        results[i] = v;
        left.done();
      });
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
  per_task(state, n, K);
}

// cospawn_counter_lazy plus what a cancellable fan-out needs: each task bound
// to its own cancellation signal (the same per-task machinery gather has).
template <kind K>
void cospawn_counter_cancellable(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    countdown left{n, {}};
    std::vector<int> results(n);
    std::deque<asio::cancellation_signal> signals;
    for (std::size_t i = 0; i < n; ++i) {
      signals.emplace_back();
      asio::co_spawn(
          ex, task<K>(static_cast<int>(i)),
          asio::bind_cancellation_slot(signals.back().slot(), [&, i](std::exception_ptr, int v) {
            results[i] = v;
            left.done();
          }));
    }
    co_await left.wait();
    benchmark::DoNotOptimize(results.data());
  });
  per_task(state, n, K);
}

#if SLUICE_ASIO_VERSION >= 102400
template <kind K>
void parallel_group_ranged(benchmark::State& state, std::size_t n) {
  run_each_iteration(state, [n]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    using op_type = decltype(asio::co_spawn(ex, task<K>(0), deferred));
    std::vector<op_type> ops;
    ops.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      ops.push_back(asio::co_spawn(ex, task<K>(static_cast<int>(i)), deferred));
    auto [order, errors, values] =
        co_await asio::experimental::make_parallel_group(std::move(ops))
            .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
    benchmark::DoNotOptimize(values.data());
  });
  per_task(state, n, K);
}
#endif

constexpr std::size_t pairs_per_run = 1000;

template <kind K>
void pair_gather(benchmark::State& state, std::size_t) {
  run_each_iteration(state, []() -> asio::awaitable<void> {
    long sum = 0;
    for (std::size_t i = 0; i < pairs_per_run; ++i) {
      auto [a, b] = co_await sluice::gather(task<K>(1), task<K>(2));
      sum += a + b;
    }
    benchmark::DoNotOptimize(sum);
  });
  per_task(state, 2 * pairs_per_run, K);
}

template <kind K>
void pair_operators(benchmark::State& state, std::size_t) {
  run_each_iteration(state, []() -> asio::awaitable<void> {
    long sum = 0;
    for (std::size_t i = 0; i < pairs_per_run; ++i) {
      auto [a, b] = co_await (task<K>(1) && task<K>(2));
      sum += a + b;
    }
    benchmark::DoNotOptimize(sum);
  });
  per_task(state, 2 * pairs_per_run, K);
}

template <kind K>
void pair_parallel_group(benchmark::State& state, std::size_t) {
  run_each_iteration(state, []() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    long sum = 0;
    for (std::size_t i = 0; i < pairs_per_run; ++i) {
      auto [order, e1, a, e2, b] =
          co_await asio::experimental::make_parallel_group(asio::co_spawn(ex, task<K>(1), deferred),
                                                           asio::co_spawn(ex, task<K>(2), deferred))
              .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
      sum += a + b;
    }
    benchmark::DoNotOptimize(sum);
  });
  per_task(state, 2 * pairs_per_run, K);
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

using bench_fn = void (*)(benchmark::State&, std::size_t);

// Registers <name>/<kind>/<arg> for both task kinds. A case of 100,000 tasks
// or more averages over that many per iteration and runs one iteration per
// repetition (`make bench` asks for 3, interleaved at random with the other
// cases, and reports the median).
void add(const std::string& name, bench_fn immediate, bench_fn suspending, std::size_t arg) {
  for (auto [k, fn] :
       {std::pair{kind::immediate, immediate}, std::pair{kind::suspending, suspending}}) {
    auto* b = benchmark::RegisterBenchmark(
        (name + "/" + kind_name(k) + "/" + std::to_string(arg)).c_str(),
        [fn = fn, arg](benchmark::State& s) { fn(s, arg); });
    if (arg >= 100'000) b->Iterations(1);
  }
}

#define SLUICE_BOTH(f, ...) \
  f<kind::immediate __VA_OPT__(, ) __VA_ARGS__>, f<kind::suspending __VA_OPT__(, ) __VA_ARGS__>

void register_all() {
  add("floor_lazy", SLUICE_BOTH(floor_lazy), tasks_per_run);
  add("floor_vector", SLUICE_BOTH(floor_vector), tasks_per_run);
  for (std::size_t limit : {8, 100}) {
    add("gwc_lazy", SLUICE_BOTH(gwc, true), limit);
    add("pool_lazy", SLUICE_BOTH(pool, true), limit);
    add("gwc_vector", SLUICE_BOTH(gwc, false), limit);
    add("pool_vector", SLUICE_BOTH(pool, false), limit);
    add("cospawn_semaphore", SLUICE_BOTH(cospawn_semaphore), limit);
  }
  for (std::size_t n : {10'000, 100'000, 1'000'000}) {
    add("gather_lazy", SLUICE_BOTH(gather_unbounded, true), n);
    add("cospawn_counter_lazy", SLUICE_BOTH(cospawn_counter, true), n);
    add("cospawn_cancellable_lazy", SLUICE_BOTH(cospawn_counter_cancellable), n);
    add("gather_vector", SLUICE_BOTH(gather_unbounded, false), n);
    add("cospawn_counter_vector", SLUICE_BOTH(cospawn_counter, false), n);
  }
#if SLUICE_ASIO_VERSION >= 102400
  add("parallel_group_ranged", SLUICE_BOTH(parallel_group_ranged), tasks_per_run);
#endif
  add("pair_gather", SLUICE_BOTH(pair_gather), 2);
  add("pair_operators", SLUICE_BOTH(pair_operators), 2);
  add("pair_parallel_group", SLUICE_BOTH(pair_parallel_group), 2);
  benchmark::RegisterBenchmark("harness_virtual_calls", harness_virtual_calls)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
}

}  // namespace

int main(int argc, char** argv) {
  return sluice_bench::run_main(argc, argv, register_all);
}
