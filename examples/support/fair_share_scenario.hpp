// SPDX-License-Identifier: BSL-1.0
// The noisy tenant, in virtual time: 10 tenants share a provider cap of 8.
// Nine quiet tenants send 2 calls each every 200 ms, 10 times; with `noisy`,
// a tenth sends 200 calls (10x a quiet tenant's load) in one burst at 0.
// Every call holds its permit for 50 ms. And all ten backlogged with weights
// (8 x 1, 2, 0.5) on a fair_semaphore{8}: each one's grants. The same for a
// rate-limited provider (a sliding window of 8 requests per 50 ms, or of 800
// tokens per 50 ms with calls of 100 tokens, the noisy tenant's of 200) and
// an adaptive_limit, FIFO beside sluice::fair_limit. Shared by
// tests/fair_semaphore_test.cpp, tests/fair_limit_test.cpp and
// examples/noisy_tenant.cpp; it ships beside the examples and includes
// installed headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_FAIR_SHARE_SCENARIO_HPP
#define SLUICE_EXAMPLES_SUPPORT_FAIR_SHARE_SCENARIO_HPP

#include <sluice/adaptive_limit.hpp>
#include <sluice/asio.hpp>
#include <sluice/fair_limit.hpp>
#include <sluice/fair_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sluice_examples::fair_share {

using namespace std::chrono_literals;

/// What the quiet tenants waited, and when the noisy burst was done.
struct waits {
  std::vector<std::chrono::nanoseconds> quiet;
  std::chrono::nanoseconds noisy_done{0};
};

/// The p-th percentile (nearest rank) of `v`, not empty.
inline std::chrono::nanoseconds percentile(std::vector<std::chrono::nanoseconds> v, int p) {
  std::sort(v.begin(), v.end());
  return v[(v.size() * static_cast<std::size_t>(p) + 99) / 100 - 1];
}

template <class Acquire>
asio::awaitable<void> one_call(sluice::testing::virtual_loop& loop, Acquire& acquire,
                               std::string tenant, std::size_t units, waits& w) {
  const auto asked = loop.now();
  [[maybe_unused]] auto permit = co_await acquire(tenant, units);
  if (tenant != "noisy") w.quiet.push_back(loop.now() - asked);
  co_await sluice::sleep(50ms);
  if (tenant == "noisy") w.noisy_done = std::max(w.noisy_done, loop.now());
}

/// The quiet tenants' calls, with or without the noisy burst, through
/// `acquire(tenant, units)` (an awaitable of what the call holds); a quiet
/// call takes `quiet_units`, a noisy one `noisy_units`.
template <class Acquire>
waits run(bool noisy, Acquire acquire, std::size_t quiet_units = 1, std::size_t noisy_units = 1) {
  sluice::testing::virtual_loop loop;
  waits w;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      if (noisy)
        for (int i = 0; i < 200; ++i) g.spawn(one_call(loop, acquire, "noisy", noisy_units, w));
      for (int round = 0; round < 10; ++round) {
        for (int t = 0; t < 9; ++t)
          for (int k = 0; k < 2; ++k)
            g.spawn(one_call(loop, acquire, "quiet" + std::to_string(t), quiet_units, w));
        co_await sluice::sleep(200ms);
      }
    });
  });
  return w;
}

/// One FIFO semaphore{8} for everyone.
inline auto fifo() {
  return [sem = std::make_shared<sluice::semaphore>(8)](const std::string&, std::size_t) {
    return sem->scoped_acquire();
  };
}
/// A fair_semaphore{8} keyed by tenant.
inline auto fair() {
  return [sem = std::make_shared<sluice::fair_semaphore<std::string>>(8)](const std::string& t,
                                                                          std::size_t) {
    return sem->scoped_acquire(t);
  };
}

/// Awaits `a` (a rate start, kept); the call holds nothing.
inline asio::awaitable<int> started(asio::awaitable<void> a) {
  co_await std::move(a);
  co_return 0;
}

/// One FIFO rate_limiter{units, per} for everyone: a call takes its units.
inline auto fifo_rate(std::size_t units, std::chrono::nanoseconds per) {
  return
      [r = std::make_shared<sluice::rate_limiter>(units, per)](const std::string&, std::size_t n) {
        return started(r->acquire(n));
      };
}
/// The same rate_limiter behind a fair_limit keyed by tenant.
inline auto fair_rate(std::size_t units, std::chrono::nanoseconds per) {
  using limit = sluice::fair_limit<sluice::rate_limiter, std::string>;
  return [r = std::make_shared<limit>(units, per)](const std::string& t, std::size_t n) {
    return started(r->acquire(t, n));
  };
}

/// The adaptive_limit of the scenarios: 8 places (it moves between 1 and 8
/// on feedback; these calls report none).
inline sluice::adaptive_limit::options adaptive_options() {
  return {.initial = 8, .min = 1, .max = 8};
}
/// One FIFO adaptive_limit for everyone.
inline auto fifo_adaptive() {
  return [a = std::make_shared<sluice::adaptive_limit>(adaptive_options())](const std::string&,
                                                                            std::size_t) {
    return a->scoped_acquire();
  };
}
/// The same adaptive_limit behind a fair_limit keyed by tenant.
inline auto fair_adaptive() {
  using limit = sluice::fair_limit<sluice::adaptive_limit, std::string>;
  return [a = std::make_shared<limit>(adaptive_options())](const std::string& t, std::size_t) {
    return a->scoped_acquire(t);
  };
}

/// The weights of the backlogged scenario, and their sum (10.5).
inline std::vector<double> weights() {
  std::vector<double> w(10, 1.0);
  w[8] = 2;
  w[9] = 0.5;
  return w;
}

inline asio::awaitable<void> take_turn(sluice::fair_semaphore<int>& sem, int t,
                                       std::vector<int>& order) {
  auto p = co_await sem.scoped_acquire(t);
  order.push_back(t);
  co_await sluice::sleep(10ms);
}

/// All ten tenants with 100 calls each queued at once on a fair_semaphore{8}
/// with weights(): the grants per tenant among the 462 after the first 8
/// (immediate) ones: 22 whole pairs of rounds of 10.5 grants, while every
/// tenant still waits.
inline std::vector<double> backlogged_grants() {
  sluice::testing::virtual_loop loop;
  sluice::fair_semaphore<int> sem{8};
  const std::vector<double> w = weights();
  for (int t = 0; t < 10; ++t) sem.set_weight(t, w[static_cast<std::size_t>(t)]);
  std::vector<int> order;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      for (int k = 0; k < 100; ++k)
        for (int t = 0; t < 10; ++t) g.spawn(take_turn(sem, t, order));
      co_return;
    });
  });
  std::vector<double> count(10, 0.0);
  for (std::size_t i = 8; i < 470; ++i) count[static_cast<std::size_t>(order[i])] += 1;
  return count;
}

template <class Acquire>
asio::awaitable<void> take_units(sluice::testing::virtual_loop& loop, Acquire& acquire, int t,
                                 std::size_t units,
                                 std::vector<std::pair<int, std::size_t>>& order) {
  [[maybe_unused]] auto held = co_await acquire(std::to_string(t), units);
  if (loop.now() > std::chrono::nanoseconds(0)) order.emplace_back(t, units);  // a wait was needed
  co_await sluice::sleep(10ms);
}

/// All ten tenants with 100 calls each queued at once on `acquire` (made by
/// `make(weights())`); call k of tenant t takes `units(t, k)`. The units each
/// tenant was granted after time 0, up to the last grant of the first tenant
/// to run out of calls (while every tenant was backlogged).
template <class Make, class Units>
std::vector<double> backlogged_units(Make make, Units units) {
  sluice::testing::virtual_loop loop;
  auto acquire = make(weights());
  std::vector<std::pair<int, std::size_t>> order;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      for (int k = 0; k < 100; ++k)
        for (int t = 0; t < 10; ++t) g.spawn(take_units(loop, acquire, t, units(t, k), order));
      co_return;
    });
  });
  std::vector<std::size_t> calls(10, 0);
  std::size_t end = order.size();
  for (std::size_t i = 0; i < order.size(); ++i) {
    ++calls[static_cast<std::size_t>(order[i].first)];
    const auto last = static_cast<std::size_t>(std::count_if(
        order.begin(), order.end(), [&](const auto& g) { return g.first == order[i].first; }));
    if (calls[static_cast<std::size_t>(order[i].first)] == last) {
      end = i + 1;
      break;
    }
  }
  std::vector<double> got(10, 0.0);
  for (std::size_t i = 0; i < end; ++i)
    got[static_cast<std::size_t>(order[i].first)] += static_cast<double>(order[i].second);
  return got;
}

/// One unit per call (requests, permits).
inline std::size_t one_unit(int, int) {
  return 1;
}
/// Tokens of call k of tenant t in the backlogged token scenario: 50 to 150.
inline std::size_t call_tokens(int t, int k) {
  return 50 + static_cast<std::size_t>((k * 37 + t * 11) % 101);
}

/// A fair_limit over `L{args...}` with weights `w`, as `acquire(tenant, units)`.
template <class L, class... Args>
auto weighted_fair(Args... args) {
  return [=](const std::vector<double>& w) {
    auto f = std::make_shared<sluice::fair_limit<L, std::string>>(args...);
    for (std::size_t t = 0; t < w.size(); ++t) f->set_weight(std::to_string(t), w[t]);
    return [f](const std::string& t, std::size_t n) {
      if constexpr (sluice::unit_limit<L>) {
        return started(f->acquire(t, n));
      } else {
        return f->scoped_acquire(t);
      }
    };
  };
}

/// Jain's fairness index over grants / weight.
inline double jain(const std::vector<double>& grants) {
  const std::vector<double> w = weights();
  double sum = 0, sq = 0;
  for (std::size_t t = 0; t < grants.size(); ++t) {
    const double x = grants[t] / w[t];
    sum += x;
    sq += x * x;
  }
  return sum * sum / (static_cast<double>(grants.size()) * sq);
}

}  // namespace sluice_examples::fair_share

#endif  // SLUICE_EXAMPLES_SUPPORT_FAIR_SHARE_SCENARIO_HPP
