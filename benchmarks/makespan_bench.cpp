// SPDX-License-Identifier: BSL-1.0
// The fan-out study: how long a batch of slow calls takes as the bound grows,
// for each way of writing the fan-out, on the simulated slow service.
//
// Scenarios (latencies drawn per call index, the same for every strategy):
//   amenity   14 calls of 1-5 s (the amenity discovery case)
//   calls200  200 calls of 50-500 ms
// Clocks: virtual (sluice::testing::virtual_loop: exact) and real (the same
// service on real time with latencies scaled by 1/100; makespans are reported
// unscaled, so both clocks' numbers compare directly).
// Strategies, for limit = 1 2 3 5 8 13 21 34 and unbounded (name suffix 0):
//   sequential         one call after another (independent of the limit: run once)
//   batches            fixed batches of `limit`, each gathered before the next
//                      starts (asyncio.gather in chunks: head-of-line blocking)
//   cospawn_semaphore  one co_spawn per call, each behind a shared sluice::semaphore
//   gather_with_concurrency  sluice::gather_with_concurrency(limit, calls)
//   map_unordered      sluice::map_unordered(call, indices, limit), read as results come
//   ideal              the greedy schedule computed here, independently of sluice:
//                      each call starts the instant one of `limit` slots is free
// Names: study/<scenario>/<clock>/<strategy>/<limit>; counters makespan_s,
// ideal_s (the greedy schedule at this limit), ratio, max_in_flight.

#include "bench_common.hpp"

#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <queue>
#include <string>
#include <vector>

namespace {

using namespace sluice_bench;
using namespace std::chrono_literals;
namespace st = sluice::testing;

constexpr double real_time_scale = 1.0 / 100;

struct scenario {
  const char* name;
  std::size_t calls;
  std::chrono::nanoseconds lo, hi;
  std::uint64_t seed;
};

const scenario scenarios[] = {{"amenity", 14, 1s, 5s, 7}, {"calls200", 200, 50ms, 500ms, 11}};

enum class strategy {
  sequential,
  batches,
  cospawn_semaphore,
  gather_with_concurrency,
  map_unordered
};

const char* strategy_name(strategy s) {
  switch (s) {
    case strategy::sequential:
      return "sequential";
    case strategy::batches:
      return "batches";
    case strategy::cospawn_semaphore:
      return "cospawn_semaphore";
    case strategy::gather_with_concurrency:
      return "gather_with_concurrency";
    case strategy::map_unordered:
      return "map_unordered";
  }
  return "?";
}

// The greedy schedule: call i (in input order) starts when the earliest of
// `limit` slots frees up. Independent of sluice.
double ideal_seconds(const scenario& sc, std::size_t limit) {
  const auto model = st::latency::uniform(sc.lo, sc.hi, sc.seed);
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (std::size_t i = 0; i < std::min(limit, sc.calls); ++i) free_at.push(0.0);
  double end = 0;
  for (std::size_t i = 0; i < sc.calls; ++i) {
    const double t = free_at.top() + std::chrono::duration<double>(model({i, "", ""})).count();
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

asio::awaitable<int> one_call(st::slow_service* svc, int i) {
  co_await svc->call();
  co_return i;
}

// Runs every call of the scenario with strategy `s`; limit is never 0 here.
asio::awaitable<void> fan_out(strategy s, st::slow_service& svc, std::size_t n, std::size_t limit) {
  switch (s) {
    case strategy::sequential:
      for (std::size_t i = 0; i < n; ++i) co_await svc.call();
      break;
    case strategy::batches:
      for (std::size_t b = 0; b < n; b += limit) {
        std::vector<asio::awaitable<void>> batch;
        for (std::size_t i = b; i < std::min(n, b + limit); ++i) batch.push_back(svc.call());
        co_await sluice::gather(std::move(batch));
      }
      break;
    case strategy::cospawn_semaphore: {
      auto ex = co_await asio::this_coro::executor;
      sluice::semaphore sem(ex, limit);
      countdown left{n, {}};
      for (std::size_t i = 0; i < n; ++i) {
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
              co_await sem.acquire();
              co_await svc.call();
              sem.release();
            },
            [&](std::exception_ptr) { left.done(); });
      }
      co_await left.wait();
      break;
    }
    case strategy::gather_with_concurrency: {
      std::vector<asio::awaitable<void>> calls;
      for (std::size_t i = 0; i < n; ++i) calls.push_back(svc.call());
      co_await sluice::gather_with_concurrency(limit, std::move(calls));
      break;
    }
    case strategy::map_unordered: {
      std::vector<int> indices(n);
      for (std::size_t i = 0; i < n; ++i) indices[i] = static_cast<int>(i);
      auto results = sluice::map_unordered([&svc](int i) { return one_call(&svc, i); },
                                           std::move(indices), limit);
      while (co_await results.next()) {
      }
      break;
    }
  }
}

void study(benchmark::State& state, const scenario& sc, bool virtual_clock, strategy s,
           std::size_t limit) {
  const std::size_t bound = limit == 0 ? sc.calls : limit;
  double makespan = 0;
  std::size_t max_in_flight = 0;
  for (auto _ : state) {
    st::slow_service svc({.latency = st::latency::uniform(sc.lo, sc.hi, sc.seed),
                          .time_scale = virtual_clock ? 1.0 : real_time_scale,
                          .record_timeline = false});
    if (virtual_clock) {
      st::virtual_loop loop;
      loop.run(fan_out(s, svc, sc.calls, bound));
      makespan = std::chrono::duration<double>(loop.now()).count();
    } else {
      asio::io_context ctx(1);
      const auto t0 = std::chrono::steady_clock::now();
      asio::co_spawn(ctx, fan_out(s, svc, sc.calls, bound), rethrow);
      ctx.run();
      makespan = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                 real_time_scale;
    }
    max_in_flight = svc.max_in_flight();
    if (svc.completed() != sc.calls) state.SkipWithError("not every call completed");
  }
  const double ideal = ideal_seconds(sc, s == strategy::sequential ? 1 : bound);
  state.counters["makespan_s"] = makespan;
  state.counters["ideal_s"] = ideal;
  state.counters["ratio"] = makespan / ideal;
  state.counters["max_in_flight"] = static_cast<double>(max_in_flight);
}

void ideal(benchmark::State& state, const scenario& sc, std::size_t limit) {
  double t = 0;
  for (auto _ : state) t = ideal_seconds(sc, limit == 0 ? sc.calls : limit);
  state.counters["makespan_s"] = t;
  state.counters["ideal_s"] = t;
  state.counters["ratio"] = 1.0;
}

void register_all() {
  const std::size_t limits[] = {1, 2, 3, 5, 8, 13, 21, 34, 0};
  const strategy bounded[] = {strategy::batches, strategy::cospawn_semaphore,
                              strategy::gather_with_concurrency, strategy::map_unordered};
  for (const scenario& sc : scenarios) {
    for (bool virt : {true, false}) {
      const std::string prefix =
          std::string("study/") + sc.name + "/" + (virt ? "virtual" : "real") + "/";
      benchmark::RegisterBenchmark(
          (prefix + "sequential/1").c_str(),
          [&sc, virt](benchmark::State& st) { study(st, sc, virt, strategy::sequential, 1); })
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
      for (strategy s : bounded)
        for (std::size_t limit : limits)
          benchmark::RegisterBenchmark(
              (prefix + strategy_name(s) + "/" + std::to_string(limit)).c_str(),
              [&sc, virt, s, limit](benchmark::State& st) { study(st, sc, virt, s, limit); })
              ->Iterations(1)
              ->Unit(benchmark::kMillisecond);
      if (virt)
        for (std::size_t limit : limits)
          benchmark::RegisterBenchmark(
              (std::string("study/") + sc.name + "/ideal/ideal/" + std::to_string(limit)).c_str(),
              [&sc, limit](benchmark::State& st) { ideal(st, sc, limit); })
              ->Iterations(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return sluice_bench::run_main(argc, argv, register_all);
}
