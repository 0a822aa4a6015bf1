// SPDX-License-Identifier: BSL-1.0
// Per-key limits, each case beside its baseline in the same process:
//
//   semaphore_uncontended          co_await sem.acquire(); sem.release();   (the baseline)
//   keyed_uncontended/<kind>       co_await ks.acquire(k); ks.release(k); one key, nobody else:
//                                  its entry is made and freed every time (int or std::string key)
//   keyed_scoped/<kind>            the same through scoped_acquire (a permit)
//   keyed_try/<kind>               try_acquire(k) and the permit's release (drop mode)
//   keyed_entry_kept/<kind>        acquire + release of a key another holder keeps in memory
//                                  (per_key 2): no entry is made or freed
//   direct_call/<callers>          <callers> coroutines each co_await the work themselves
//                                  (one post), round after round: the cost without dedupe
//   single_flight_hit/<callers>    the same callers through single_flight::run on one key: one
//                                  caller starts the work, the others join it; `per_call`
//   single_flight_miss             one caller, one execution per call (co_spawn of the work)
//   distinct_keys_memory/<n>/<held>  n distinct keys acquired one after another, `held` of them
//                                  held at a time, in a forked child: peak RSS (VmHWM), its
//                                  growth during the run, and the heap in use (mallinfo2)
//                                  sampled every 1000 keys: flat in n.

#include <sluice/keyed_semaphore.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/single_flight.hpp>

#include <support/asio.hpp>

#include <benchmark/benchmark.h>

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <string>

namespace {

void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

// Runs `body(state)` as one coroutine on a fresh io_context; the coroutine
// drives the benchmark loop itself.
void run_coroutine(benchmark::State& state,
                   std::function<asio::awaitable<void>(benchmark::State&)> body) {
  asio::io_context ctx(1);
  asio::co_spawn(ctx, body(state), rethrow);
  ctx.run();
}

// Key kinds: 0 = int, 1 = std::string of an account id (heap-allocated, 24 chars).
template <class Key>
Key key_of(std::int64_t i);
template <>
int key_of<int>(std::int64_t i) {
  return static_cast<int>(i);
}
template <>
std::string key_of<std::string>(std::int64_t i) {
  return "account-0000000000" + std::to_string(100000 + i);
}

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

template <class Key>
void keyed_uncontended(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::keyed_semaphore<Key> ks{1};
    const Key k = key_of<Key>(7);
    for (auto _ : s) {
      co_await ks.acquire(k);
      ks.release(k);
    }
  });
}
BENCHMARK_TEMPLATE(keyed_uncontended, int);
BENCHMARK_TEMPLATE(keyed_uncontended, std::string);

template <class Key>
void keyed_scoped(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::keyed_semaphore<Key> ks{1};
    const Key k = key_of<Key>(7);
    for (auto _ : s) {
      auto permit = co_await ks.scoped_acquire(k);
      benchmark::DoNotOptimize(permit);
    }
  });
}
BENCHMARK_TEMPLATE(keyed_scoped, int);
BENCHMARK_TEMPLATE(keyed_scoped, std::string);

template <class Key>
void keyed_try(benchmark::State& state) {
  sluice::keyed_semaphore<Key> ks{1};
  const Key k = key_of<Key>(7);
  for (auto _ : state) {
    auto permit = ks.try_acquire(k);
    benchmark::DoNotOptimize(permit);
  }
}
BENCHMARK_TEMPLATE(keyed_try, int);
BENCHMARK_TEMPLATE(keyed_try, std::string);

template <class Key>
void keyed_entry_kept(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::keyed_semaphore<Key> ks{2};
    const Key k = key_of<Key>(7);
    auto keeper = ks.try_acquire(k);  // holds the key's entry in memory
    for (auto _ : s) {
      co_await ks.acquire(k);
      ks.release(k);
    }
  });
}
BENCHMARK_TEMPLATE(keyed_entry_kept, int);
BENCHMARK_TEMPLATE(keyed_entry_kept, std::string);

// The shared work: one trip through the loop, then a small result.
asio::awaitable<int> one_post() {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  co_return 42;
}

constexpr int rounds = 100;

// `callers` coroutines, `rounds` rounds each, every call through `call`.
void callers_in_rounds(benchmark::State& state, std::function<asio::awaitable<int>()> call) {
  const auto callers = state.range(0);
  std::int64_t sum = 0;
  for (auto _ : state) {
    asio::io_context ctx(1);
    for (std::int64_t c = 0; c < callers; ++c) {
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            for (int r = 0; r < rounds; ++r) sum += co_await call();
          },
          rethrow);
    }
    ctx.run();
  }
  benchmark::DoNotOptimize(sum);
  state.counters["per_call"] =
      benchmark::Counter(static_cast<double>(state.iterations() * callers * rounds),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void direct_call(benchmark::State& state) {
  callers_in_rounds(state, one_post);
}
BENCHMARK(direct_call)->Arg(16)->Arg(64);

void single_flight_hit(benchmark::State& state) {
  sluice::single_flight<int, int> flights;
  std::int64_t executions = 0;
  auto work = [&] {
    ++executions;
    return one_post();
  };
  callers_in_rounds(state, [&] { return flights.run(1, work); });
  state.counters["callers_per_execution"] =
      static_cast<double>(state.iterations() * state.range(0) * rounds) /
      static_cast<double>(executions);
}
BENCHMARK(single_flight_hit)->Arg(16)->Arg(64);

void single_flight_miss(benchmark::State& state) {
  run_coroutine(state, [](benchmark::State& s) -> asio::awaitable<void> {
    sluice::single_flight<int, int> flights;
    auto work = []() -> asio::awaitable<int> {
      co_return 1;
    };
    std::int64_t sum = 0;
    for (auto _ : s) sum += co_await flights.run(1, work);
    benchmark::DoNotOptimize(sum);
  });
}
BENCHMARK(single_flight_miss);

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

long heap_in_use() {
  return static_cast<long>(mallinfo2().uordblks);
}

// n distinct std::string keys, `held` at a time (each key is acquired, and the
// key acquired `held` keys earlier is released), in a forked child.
void distinct_keys_memory(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const std::int64_t held = state.range(1);
  // rss before, peak rss, max heap growth, keys() at the end, most keys at once
  long result[5] = {-1, -1, -1, -1, -1};
  for (auto _ : state) {
    int fds[2];
    if (pipe(fds) != 0) {
      state.SkipWithError("pipe failed");
      return;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      long out[5] = {status_kb("VmRSS:"), 0, 0, 0, 0};
      asio::io_context ctx(1);
      sluice::keyed_semaphore<std::string> ks{1};
      const long heap_before = heap_in_use();
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            std::deque<sluice::keyed_semaphore<std::string>::permit> permits;
            for (std::int64_t i = 0; i < n; ++i) {
              permits.push_back(co_await ks.scoped_acquire(key_of<std::string>(i)));
              if (static_cast<std::int64_t>(permits.size()) > held) permits.pop_front();
              out[4] = std::max(out[4], static_cast<long>(ks.keys()));
              if (i % 1000 == 0) out[2] = std::max(out[2], heap_in_use() - heap_before);
            }
          },
          rethrow);
      ctx.run();
      out[1] = status_kb("VmHWM:");
      out[3] = static_cast<long>(ks.keys());
      const auto written = write(fds[1], out, sizeof out);
      _exit(written == static_cast<long>(sizeof out) ? 0 : 1);
    }
    close(fds[1]);
    const auto got = read(fds[0], result, sizeof result);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != static_cast<long>(sizeof result) || result[3] != 0)
      state.SkipWithError("child failed, or keys were left");
  }
  state.counters["peak_rss_kb"] = static_cast<double>(result[1]);
  state.counters["rss_growth_kb"] = static_cast<double>(result[1] - result[0]);
  state.counters["heap_growth_max_kb"] = static_cast<double>(result[2]) / 1024.0;
  state.counters["keys_at_end"] = static_cast<double>(result[3]);
  state.counters["most_keys"] = static_cast<double>(result[4]);
}
BENCHMARK(distinct_keys_memory)
    ->Args({10'000, 1})
    ->Args({1'000'000, 1})
    ->Args({10'000, 1000})
    ->Args({1'000'000, 1000})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
