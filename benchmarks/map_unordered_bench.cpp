// SPDX-License-Identifier: BSL-1.0
// map_unordered per-task overhead beside its baselines, and its peak memory
// over 10 thousand vs 10 million lazily generated inputs.
//
// Names are <workload>/<task kind>/<limit>; both task kinds (completing at
// once; suspending once through a post).
//   mu_floor_lazy          co_await fn(x) for each input in turn (the floor)
//   map_unordered          limit 64 over a lazy input, read in completion order
//                          by a `while (auto r = co_await s.next())` loop
//   map_unordered_for_each the same stream consumed by sluice::for_each (takes
//                          results already waiting without a next() frame)
//   mu_channel_pool        Asio peer: 64 workers on a shared index send results
//                          through an asio::experimental::channel of capacity 64
//   mu_cospawn_per_task    one co_spawn per task, a counter for completion
//   peak_rss/<n>           map_unordered over n lazy inputs, limit 64, run in a
//                          forked child; counters peak_rss_kb (VmHWM) and
//                          rss_growth_kb (VmHWM minus VmRSS before the run)
//
#include "bench_common.hpp"

#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>

namespace {

using namespace sluice_bench;

constexpr std::int64_t tasks_per_iteration = 10000;
constexpr std::size_t limit = 64;

// A lazy counting range [0, n): std::views::iota without std::views, which
// clang 14 cannot instantiate with libstdc++ 12.
class iota_input {
 public:
  class iterator {
   public:
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(std::int64_t v) : v_(v) {}
    std::int64_t operator*() const { return v_; }
    iterator& operator++() {
      ++v_;
      return *this;
    }
    iterator operator++(int) {
      auto old = *this;
      ++v_;
      return old;
    }
    bool operator==(const iterator&) const = default;

   private:
    std::int64_t v_ = 0;
  };
  explicit iota_input(std::int64_t n) : n_(n) {}
  iterator begin() const { return iterator(0); }
  iterator end() const { return iterator(n_); }

 private:
  std::int64_t n_;
};

asio::awaitable<std::int64_t> immediate(std::int64_t i) {
  co_return i;
}

// Lazy floor: co_await fn(x) for each input in turn, the frame made and
// awaited at once.
template <kind K>
void floor_lazy(benchmark::State& state) {
  std::int64_t sum = 0;
  run_each_iteration(state, [&]() -> asio::awaitable<void> {
    for (std::int64_t i = 0; i < tasks_per_iteration; ++i)
      sum += co_await task<K>(static_cast<int>(i));
  });
  benchmark::DoNotOptimize(sum);
  per_task(state, tasks_per_iteration, K);
}

template <kind K>
void map_unordered(benchmark::State& state) {
  std::int64_t sum = 0;
  run_each_iteration(state, [&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([](std::int64_t i) { return task<K>(static_cast<int>(i)); },
                                   iota_input(tasks_per_iteration), limit);
    while (auto r = co_await s.next()) sum += *r;
  });
  benchmark::DoNotOptimize(sum);
  per_task(state, tasks_per_iteration, K);
}

template <kind K>
void map_unordered_for_each(benchmark::State& state) {
  std::int64_t sum = 0;
  run_each_iteration(state, [&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([](std::int64_t i) { return task<K>(static_cast<int>(i)); },
                              iota_input(tasks_per_iteration), limit),
        [&](int r) { sum += r; });
  });
  benchmark::DoNotOptimize(sum);
  per_task(state, tasks_per_iteration, K);
}

// One co_spawn per task, a counter for completion (unbounded).
template <kind K>
void cospawn_per_task(benchmark::State& state) {
  std::int64_t sum = 0;
  run_each_iteration(state, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    countdown left{tasks_per_iteration, {}};
    for (std::int64_t i = 0; i < tasks_per_iteration; ++i)
      asio::co_spawn(ex, task<K>(static_cast<int>(i)), [&](std::exception_ptr, int v) {
        sum += v;
        left.done();
      });
    co_await left.wait();
  });
  benchmark::DoNotOptimize(sum);
  per_task(state, tasks_per_iteration, K);
}

// The Asio peer: `limit` workers pulling a shared index, handing each result
// to the consumer through an asio::experimental::channel of capacity `limit`
// (completion order, bounded like map_unordered).
template <kind K>
void channel_pool(benchmark::State& state) {
  std::int64_t sum = 0;
  run_each_iteration(state, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    asio::experimental::channel<void(sluice::error_code, int)> results(ex, limit);
    std::int64_t next = 0;
    for (std::size_t w = 0; w < limit; ++w)
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            for (std::int64_t i; (i = next++) < tasks_per_iteration;)
              co_await results.async_send(
                  sluice::error_code{}, co_await task<K>(static_cast<int>(i)), asio::use_awaitable);
          },
          rethrow);
    for (std::int64_t i = 0; i < tasks_per_iteration; ++i)
      sum += co_await results.async_receive(asio::use_awaitable);
  });
  benchmark::DoNotOptimize(sum);
  per_task(state, tasks_per_iteration, K);
}

#define SLUICE_BOTH_KINDS(f, name)                                     \
  BENCHMARK_TEMPLATE(f, kind::immediate)                               \
      ->Name(std::string(name "/immediate/") + std::to_string(limit)); \
  BENCHMARK_TEMPLATE(f, kind::suspending)                              \
      ->Name(std::string(name "/suspending/") + std::to_string(limit))

SLUICE_BOTH_KINDS(floor_lazy, "mu_floor_lazy");
SLUICE_BOTH_KINDS(map_unordered, "map_unordered");
SLUICE_BOTH_KINDS(map_unordered_for_each, "map_unordered_for_each");
SLUICE_BOTH_KINDS(channel_pool, "mu_channel_pool");
SLUICE_BOTH_KINDS(cospawn_per_task, "mu_cospawn_per_task");

// "VmHWM:" or "VmRSS:" of this process, in kB.
long status_kb(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0) kb = std::atol(line + n);
  std::fclose(f);
  return kb;
}

// Runs map_unordered over n lazy inputs in a forked child (a fresh high-water
// mark) and reports the child's peak RSS.
void peak_rss(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  long result[3] = {-1, -1, -1};
  for (auto _ : state) {
    int fds[2];
    if (pipe(fds) != 0) {
      state.SkipWithError("pipe failed");
      return;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      long out[3];
      out[0] = status_kb("VmRSS:");
      asio::io_context ctx(1);
      std::int64_t count = 0;
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto s = sluice::map_unordered(immediate, iota_input(n), limit);
            while (co_await s.next()) ++count;
          },
          asio::detached);
      ctx.run();
      out[1] = status_kb("VmHWM:");
      out[2] = count;
      const auto written = write(fds[1], out, sizeof out);
      _exit(written == static_cast<long>(sizeof out) ? 0 : 1);
    }
    close(fds[1]);
    const auto got = read(fds[0], result, sizeof result);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != static_cast<long>(sizeof result) || result[2] != n)
      state.SkipWithError("child failed");
  }
  state.counters["peak_rss_kb"] = static_cast<double>(result[1]);
  state.counters["rss_growth_kb"] = static_cast<double>(result[1] - result[0]);
  state.counters["inputs"] = static_cast<double>(n);
}
BENCHMARK(peak_rss)->Arg(10'000)->Arg(10'000'000)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
