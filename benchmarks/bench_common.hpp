// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_BENCHMARKS_BENCH_COMMON_HPP
#define SLUICE_BENCHMARKS_BENCH_COMMON_HPP

// Pieces shared by the timing benchmarks: the two task kinds, a lazy range of
// tasks, the per-task counter, and the hand-written baselines' countdown and
// naive semaphore (what an Asio user writes without sluice).

#include <sluice/detail/completion.hpp>

#include <support/asio.hpp>
#include <support/bench_coroutine.hpp>

// The Asio peers: parallel groups, deferred operations, channels.
#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#if BOOST_ASIO_VERSION >= 102400
#include <boost/asio/deferred.hpp>
#endif
#else
#include <asio/experimental/channel.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>
#endif

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <utility>
#include <vector>

#if defined(SLUICE_BENCH_COUNT_ALLOCATIONS)
#include <atomic>
#include <cstdlib>

// Every heap allocation of the process is counted (glibc: malloc and
// aligned_alloc forward to the allocator's own entry points; free is
// untouched). Standalone Asio allocates through operator new (malloc),
// Boost.Asio's recycling allocator through aligned_alloc. Define the macro
// in a benchmark's only translation unit, before this header.
extern "C" void* __libc_malloc(std::size_t) noexcept;
extern "C" void* __libc_memalign(std::size_t, std::size_t) noexcept;
namespace sluice_bench {
inline std::atomic<long> allocations{0};
inline void count_allocation() noexcept {
  allocations.store(allocations.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
}  // namespace sluice_bench
extern "C" void* malloc(std::size_t n) noexcept {
  sluice_bench::count_allocation();
  return __libc_malloc(n);
}
extern "C" void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
  sluice_bench::count_allocation();
  return __libc_memalign(alignment, n);
}
#endif

namespace sluice_bench {

// asio::deferred moved out of experimental in Asio 1.24 (Boost 1.80).
#if SLUICE_ASIO_VERSION >= 102400
inline constexpr auto deferred = asio::deferred;
#else
inline constexpr auto deferred = asio::experimental::deferred;
#endif

// The task kinds every fan-out benchmark runs with: a task that completes at
// once (only the machinery is timed, and a worker may run every task inline),
// and a task that suspends once (one post through the loop, so every task is
// really in flight at the same time as its siblings).
enum class kind { immediate, suspending };

inline const char* kind_name(kind k) {
  return k == kind::immediate ? "immediate" : "suspending";
}

template <kind K>
asio::awaitable<int> task(int x) {
  if constexpr (K == kind::suspending)
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  co_return x + 1;
}

// A lazy input range [0, n) whose elements are made by `make(i)` when pulled
// (std::views::transform without std::views, which clang 14 cannot
// instantiate with libstdc++ 12). No type erasure: `make` is called directly.
template <class F>
class lazy_range {
 public:
  class iterator {
   public:
    using value_type = decltype(std::declval<F&>()(0));
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const F* f, int i) : f_(f), i_(i) {}
    value_type operator*() const { return (*f_)(i_); }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    void operator++(int) { ++i_; }
    bool operator==(const iterator& o) const { return i_ == o.i_; }

   private:
    const F* f_ = nullptr;
    int i_ = 0;
  };
  lazy_range(std::size_t n, F f) : n_(static_cast<int>(n)), f_(std::move(f)) {}
  iterator begin() const { return iterator(&f_, 0); }
  iterator end() const { return iterator(&f_, n_); }

 private:
  int n_;
  F f_;
};

template <kind K>
auto lazy_tasks(std::size_t n) {
  return lazy_range(n, [](int i) { return task<K>(i); });
}

template <kind K>
std::vector<asio::awaitable<int>> vector_tasks(std::size_t n) {
  std::vector<asio::awaitable<int>> v;
  v.reserve(n);
  for (std::size_t i = 0; i < n; ++i) v.push_back(task<K>(static_cast<int>(i)));
  return v;
}

// Reports time per task as the counter "ns_per_task" (the report reads it),
// and heap allocations per task as "allocs_per_task" where they are counted.
inline void per_task(benchmark::State& state, std::size_t tasks_per_iteration, kind k) {
  const double tasks = static_cast<double>(state.iterations() * tasks_per_iteration);
  state.SetItemsProcessed(static_cast<std::int64_t>(tasks));
  state.counters["ns_per_task"] = benchmark::Counter(
      static_cast<double>(tasks_per_iteration),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  if (auto a = state.counters.find("allocations"); a != state.counters.end()) {
    state.counters["allocs_per_task"] = a->second.value / tasks;
    state.counters.erase(a);
  }
  state.SetLabel(kind_name(k));
}

// Runs `body()` (an awaitable) to completion once per benchmark iteration
// (and, where allocations are counted, records them for per_task).
template <class Body>
void run_each_iteration(benchmark::State& state, Body body) {
  asio::io_context ctx(1);
#if defined(SLUICE_BENCH_COUNT_ALLOCATIONS)
  const long before = allocations.load(std::memory_order_relaxed);
#endif
  for (auto _ : state) {
    asio::co_spawn(ctx, body(), rethrow);
    ctx.restart();
    ctx.run();
  }
#if defined(SLUICE_BENCH_COUNT_ALLOCATIONS)
  state.counters["allocations"] =
      static_cast<double>(allocations.load(std::memory_order_relaxed) - before);
#endif
}

// Waits until `pending` drops to zero (the hand-written join).
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

// The minimal semaphore a literal port of asyncio's pattern hand-rolls: a
// count and a FIFO of handlers.
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

// main() of a benchmark whose cases are registered at run time.
inline int run_main(int argc, char** argv, void (*register_all)()) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace sluice_bench

#endif  // SLUICE_BENCHMARKS_BENCH_COMMON_HPP
