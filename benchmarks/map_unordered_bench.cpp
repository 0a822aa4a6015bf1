// SPDX-License-Identifier: BSL-1.0
// map_unordered per-task overhead beside its baselines, and its peak memory
// over 10 thousand vs 10 million lazily generated inputs.
//
//   sequential_loop        co_await each task in turn (the floor)
//   map_unordered          limit 64 over a lazy input, read in completion order
//   co_spawn_per_task      one co_spawn per task, a counter for completion
//   peak_rss/<n>           map_unordered over n lazy inputs, limit 64, run in a
//                          forked child; counters peak_rss_kb (VmHWM) and
//                          rss_growth_kb (VmHWM minus VmRSS before the run)
//
// Tasks complete at once, so the numbers are the machinery's cost per task.
#include <sluice/map_unordered.hpp>

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>

namespace {

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

void set_per_task(benchmark::State& state, std::int64_t per_iteration) {
  state.SetItemsProcessed(state.iterations() * per_iteration);
  state.counters["time_per_task"] = benchmark::Counter(
      static_cast<double>(per_iteration),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void sequential_loop(benchmark::State& state) {
  asio::io_context ctx(1);
  std::int64_t sum = 0;
  for (auto _ : state) {
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          for (std::int64_t i = 0; i < tasks_per_iteration; ++i) sum += co_await immediate(i);
        },
        asio::detached);
    ctx.restart();
    ctx.run();
  }
  benchmark::DoNotOptimize(sum);
  set_per_task(state, tasks_per_iteration);
}
BENCHMARK(sequential_loop);

void map_unordered(benchmark::State& state) {
  asio::io_context ctx(1);
  std::int64_t sum = 0;
  for (auto _ : state) {
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          auto s = sluice::map_unordered(immediate, iota_input(tasks_per_iteration), limit);
          while (auto r = co_await s.next()) sum += *r;
        },
        asio::detached);
    ctx.restart();
    ctx.run();
  }
  benchmark::DoNotOptimize(sum);
  set_per_task(state, tasks_per_iteration);
}
BENCHMARK(map_unordered);

void co_spawn_per_task(benchmark::State& state) {
  asio::io_context ctx(1);
  std::int64_t sum = 0;
  for (auto _ : state) {
    std::int64_t pending = tasks_per_iteration;
    for (std::int64_t i = 0; i < tasks_per_iteration; ++i)
      asio::co_spawn(ctx, immediate(i), [&](std::exception_ptr, std::int64_t v) {
        sum += v;
        --pending;
      });
    ctx.restart();
    ctx.run();
    if (pending != 0) state.SkipWithError("tasks left");
  }
  benchmark::DoNotOptimize(sum);
  set_per_task(state, tasks_per_iteration);
}
BENCHMARK(co_spawn_per_task);

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
