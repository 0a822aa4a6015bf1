// SPDX-License-Identifier: BSL-1.0
// The two call-policy scenarios of docs/provider-limits.md, in virtual time:
// tail latency with and without a hedge (1% of calls 100x slower), and
// overload (arrivals at twice the provider's capacity for a minute) with and
// without shedding. Shared by tests/policy_test.cpp (which asserts the
// figures) and examples/call_policies.cpp (which prints the tables); it ships
// beside the examples and includes installed headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_POLICY_SCENARIOS_HPP
#define SLUICE_EXAMPLES_SUPPORT_POLICY_SCENARIOS_HPP

#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/hedge.hpp>
#include <sluice/policy.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shed.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice_examples::policies {

using namespace std::chrono_literals;
using ns = std::chrono::nanoseconds;

/// The q-quantile of `v` by nearest rank (0 for an empty `v`).
inline ns quantile(std::vector<ns> v, double q) {
  if (v.empty()) return ns{0};
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

// ---- tail latency -------------------------------------------------------------

/// Requests in the tail-latency scenario, one after another, each a fan-out
/// of `fan_out` calls to the provider ("The Tail at Scale": with 1% of calls
/// slow, about 10% of such requests wait for a slow one).
inline constexpr std::size_t tail_requests = 500;
inline constexpr std::size_t fan_out = 10;

/// 10-11 ms per call; a call drawn with probability 1% (seeded hash of its
/// index) takes 100x as long.
inline sluice::testing::latency_model heavy_tail() {
  return [](const sluice::testing::call_info& c) {
    std::uint64_t x = c.index + 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    const ns base = 10ms + std::chrono::microseconds(x % 1000);
    return (x >> 20) % 100 == 0 ? base * 100 : base;
  };
}

/// One run of the tail scenario: request latencies, and calls.
struct tail_result {
  ns p50, p95, p99, max;
  std::size_t calls;        ///< calls made (requests x fan-out)
  std::size_t provider;     ///< calls the provider served (attempts, hedges included)
  std::vector<ns> latency;  ///< every request's latency, in request order
  double extra() const {
    return static_cast<double>(provider - calls) / static_cast<double>(calls);
  }
};

/// `tail_requests` requests, each call hedged at the p95 (at most `budget`
/// extra calls) or not.
inline tail_result run_tail(bool hedged, double budget = 0.05) {
  sluice::testing::virtual_loop loop;
  sluice::testing::slow_service api({.latency = heavy_tail()});
  auto p = sluice::policy(sluice::hedge({.quantile = hedged ? 0.95 : 0.0, .budget = budget}));
  std::vector<ns> latency;
  loop.run([&]() -> asio::awaitable<void> {
    for (std::size_t i = 0; i < tail_requests; ++i) {
      const auto start = loop.now();
      std::vector<asio::awaitable<void>> calls;
      for (std::size_t k = 0; k < fan_out; ++k) calls.push_back(p([&] { return api.call(); }));
      co_await sluice::gather(std::move(calls));
      latency.push_back(loop.now() - start);
    }
  });
  return {quantile(latency, 0.5),
          quantile(latency, 0.95),
          quantile(latency, 0.99),
          quantile(latency, 1.0),
          tail_requests * fan_out,
          api.calls(),
          latency};
}

// ---- overload -----------------------------------------------------------------

/// The provider serves 4 calls at once, 100 ms each: 40 calls a second.
inline constexpr std::size_t capacity = 4;
/// Arrivals every 12.5 ms (80 a second, twice the capacity) for a minute.
inline constexpr ns arrival_gap = 12500us;
inline constexpr ns overload_for = 60s;
/// The shedding bound: 8 waiting callers (200 ms of work at capacity).
inline constexpr std::size_t max_waiting = 8;

/// One run of the overload scenario.
struct overload_result {
  std::size_t arrived = 0, accepted = 0, shed = 0;
  ns p50_wait{}, p99_wait{}, max_wait{};  ///< of the accepted calls, arrival to start
  ns last_done{};                         ///< when the last accepted call ended
};

/// Arrivals at twice the capacity for a minute, with or without shedding.
inline overload_result run_overload(bool shedding) {
  sluice::testing::virtual_loop loop;
  sluice::testing::slow_service api({.latency = sluice::testing::latency::fixed(100ms)});
  sluice::semaphore cap{capacity};
  auto p = sluice::policy(
      sluice::shed(cap, {.max_waiting = shedding ? max_waiting : static_cast<std::size_t>(-1)}));
  overload_result r;
  std::vector<ns> waits;
  auto one = [&]() -> asio::awaitable<void> {
    const ns arrived = loop.now();
    try {
      co_await p([&]() -> asio::awaitable<void> {
        waits.push_back(loop.now() - arrived);
        co_await api.call();
      });
      ++r.accepted;
    } catch (const sluice::overloaded_error&) {
      ++r.shed;
    }
    r.last_done = std::max(r.last_done, loop.now());
  };
  loop.run(sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
    for (ns t{0}; t < overload_for; t += arrival_gap) {
      co_await sluice::sleep_until(sluice::clock::time_point(t));
      ++r.arrived;
      (void)g.spawn(one());
    }
  }));
  r.p50_wait = quantile(waits, 0.5);
  r.p99_wait = quantile(waits, 0.99);
  r.max_wait = quantile(waits, 1.0);
  return r;
}

}  // namespace sluice_examples::policies

#endif  // SLUICE_EXAMPLES_SUPPORT_POLICY_SCENARIOS_HPP
