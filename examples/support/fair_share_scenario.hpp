// SPDX-License-Identifier: BSL-1.0
// The noisy tenant, in virtual time: 10 tenants share a provider cap of 8.
// Nine quiet tenants send 2 calls each every 200 ms, 10 times; with `noisy`,
// a tenth sends 200 calls (10x a quiet tenant's load) in one burst at 0.
// Every call holds its permit for 50 ms. And all ten backlogged with weights
// (8 x 1, 2, 0.5) on a fair_semaphore{8}: each one's grants. Shared by
// tests/fair_semaphore_test.cpp and examples/noisy_tenant.cpp; it ships
// beside the examples and includes installed headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_FAIR_SHARE_SCENARIO_HPP
#define SLUICE_EXAMPLES_SUPPORT_FAIR_SHARE_SCENARIO_HPP

#include <sluice/asio.hpp>
#include <sluice/fair_semaphore.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
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
                               std::string tenant, waits& w) {
  const auto asked = loop.now();
  auto permit = co_await acquire(tenant);
  if (tenant != "noisy") w.quiet.push_back(loop.now() - asked);
  co_await sluice::sleep(50ms);
  if (tenant == "noisy") w.noisy_done = std::max(w.noisy_done, loop.now());
}

/// The quiet tenants' calls, with or without the noisy burst, through
/// `acquire(tenant)` (an awaitable permit).
template <class Acquire>
waits run(bool noisy, Acquire acquire) {
  sluice::testing::virtual_loop loop;
  waits w;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      if (noisy)
        for (int i = 0; i < 200; ++i) g.spawn(one_call(loop, acquire, "noisy", w));
      for (int round = 0; round < 10; ++round) {
        for (int t = 0; t < 9; ++t)
          for (int k = 0; k < 2; ++k)
            g.spawn(one_call(loop, acquire, "quiet" + std::to_string(t), w));
        co_await sluice::sleep(200ms);
      }
    });
  });
  return w;
}

/// One FIFO semaphore{8} for everyone.
inline auto fifo() {
  return [sem = std::make_shared<sluice::semaphore>(8)](const std::string&) {
    return sem->scoped_acquire();
  };
}
/// A fair_semaphore{8} keyed by tenant.
inline auto fair() {
  return [sem = std::make_shared<sluice::fair_semaphore<std::string>>(8)](const std::string& t) {
    return sem->scoped_acquire(t);
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
