// SPDX-License-Identifier: BSL-1.0
// The provider whose capacity changes (8 in flight for 5 minutes, then 3 for
// 5 minutes, then 12), run in virtual time through a fixed semaphore, an
// adaptive_limit, or an oracle that knows the capacity at every instant.
// Shared by tests/adaptive_limit_test.cpp and examples/adaptive_limits.cpp; it
// ships beside the examples and includes installed headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_CAPACITY_SCENARIO_HPP
#define SLUICE_EXAMPLES_SUPPORT_CAPACITY_SCENARIO_HPP

#include <sluice/adaptive_limit.hpp>
#include <sluice/asio.hpp>
#include <sluice/gather.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace sluice_examples::capacity {

using namespace std::chrono_literals;

/// Jobs in the batch: the oracle takes about 15 minutes.
inline constexpr std::size_t jobs = 3000;
/// Workers pulling jobs (more than any limit reaches).
inline constexpr std::size_t workers = 64;
/// A throttled job waits this long, holding nothing, then queues again.
inline constexpr auto retry_delay = 1s;

/// 1 s idle latency, 2.5 s at capacity; a call over the capacity is throttled.
inline sluice::testing::slow_service::options service_options() {
  return {.latency = sluice::testing::latency::fixed(1s),
          .capacity = {{0s, 8}, {5min, 3}, {10min, 12}},
          .load_latency = 1.5};
}

/// One run: its makespan, calls (throttled ones included), throttles, and the
/// limit sampled each second.
struct result {
  std::string name;
  std::chrono::nanoseconds makespan{};
  std::size_t calls = 0;
  std::size_t throttles = 0;
  std::vector<std::pair<double, std::size_t>> limit_trace;  // (seconds, limit)
};

// Runs the batch: each job calls attempt() until it returns true (false: it
// was throttled; the job sleeps retry_delay first). `side` runs beside the
// workers until they are done (sampling, or the oracle's schedule).
template <class Attempt, class Side>
result run_batch(std::string name, sluice::testing::virtual_loop& loop,
                 sluice::testing::slow_service& svc, Attempt attempt, Side side) {
  result r;
  r.name = std::move(name);
  std::size_t next = 0, running = workers;
  auto worker = [&]() -> asio::awaitable<void> {
    while (next < jobs) {
      ++next;
      while (!co_await attempt()) co_await sluice::sleep(retry_delay);
    }
    r.makespan = std::max(r.makespan, loop.now());
    --running;
  };
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> all;
    for (std::size_t i = 0; i < workers; ++i) all.push_back(worker());
    all.push_back(side([&] { return running == 0; }));
    co_await sluice::gather(std::move(all));
  });
  r.calls = svc.calls();
  r.throttles = svc.throttles();
  return r;
}

/// A fixed limit: a plain semaphore.
inline result run_fixed(std::size_t limit) {
  sluice::testing::virtual_loop loop;
  sluice::testing::slow_service svc(service_options());
  sluice::semaphore sem{limit};
  auto attempt = [&]() -> asio::awaitable<bool> {
    auto p = co_await sem.scoped_acquire();
    try {
      co_await svc.call();
    } catch (const sluice::testing::throttled_error&) {
      co_return false;
    }
    co_return true;
  };
  auto idle = [](auto) -> asio::awaitable<void> {
    co_return;
  };
  return run_batch("fixed " + std::to_string(limit), loop, svc, attempt, idle);
}

// Runs the batch through `cap` (cap.run(fn): slow_service's throttles are
// retryable, so they count as throttled), sampling its limit.
// `schedule`, if set, is the oracle's: it sets the limit to the capacity at
// each step.
inline result run_limit(std::string name, sluice::adaptive_limit& cap, bool schedule) {
  sluice::testing::virtual_loop loop;
  sluice::testing::slow_service svc(service_options());
  auto attempt = [&]() -> asio::awaitable<bool> {
    try {
      co_await cap.run([&] { return svc.call(); });
    } catch (const sluice::testing::throttled_error&) {
      co_return false;
    }
    co_return true;
  };
  std::vector<std::pair<double, std::size_t>> trace;
  auto side = [&](auto done) -> asio::awaitable<void> {
    const auto steps = service_options().capacity;
    std::size_t step = 0;
    while (!done()) {
      const auto t = loop.now();
      while (schedule && step < steps.size() && steps[step].at <= t)
        cap.set_limit(steps[step++].max_in_flight);
      trace.emplace_back(std::chrono::duration<double>(t).count(), cap.limit());
      co_await sluice::sleep(1s);
    }
  };
  auto r = run_batch(std::move(name), loop, svc, attempt, side);
  r.limit_trace = std::move(trace);
  return r;
}

/// The oracle: a limit set to the capacity at every step (never probing).
inline result run_oracle() {
  sluice::adaptive_limit cap{{.initial = 8,
                              .min = 1,
                              .max = 64,
                              .algorithm = sluice::aimd{.increase = 0, .backoff = 1.0}}};
  return run_limit("oracle", cap, true);
}

/// An adaptive limit with `algorithm`, starting at 4 in [1, 64].
template <class Algorithm>
result run_adaptive(std::string name, Algorithm algorithm) {
  sluice::adaptive_limit cap{{.initial = 4, .min = 1, .max = 64, .algorithm = algorithm}};
  return run_limit(std::move(name), cap, false);
}

}  // namespace sluice_examples::capacity

#endif  // SLUICE_EXAMPLES_SUPPORT_CAPACITY_SCENARIO_HPP
