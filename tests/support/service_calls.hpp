// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_SERVICE_CALLS_HPP
#define SLUICE_TESTS_SUPPORT_SERVICE_CALLS_HPP

// Tasks over a sluice::testing::slow_service keyed by an int input, for the
// fan-out and stream tests, and the inputs 0..n-1.

#include <sluice/testing/slow_service.hpp>

#include <support/asio.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice_test {

// A call keyed by `i`, returning `i`.
inline asio::awaitable<int> call(sluice::testing::slow_service& svc, int i, std::string op = {}) {
  co_await svc.call(std::to_string(i), std::move(op));
  co_return i;
}

// The same, but input `fail_at` throws "task <i> failed" after its call.
inline asio::awaitable<int> call_or_fail(sluice::testing::slow_service& svc, int i, int fail_at) {
  co_await svc.call(std::to_string(i));
  if (i == fail_at) throw std::runtime_error("task " + std::to_string(i) + " failed");
  co_return i;
}

// 0, 1, ..., n - 1.
inline std::vector<int> iota_vec(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_SERVICE_CALLS_HPP
