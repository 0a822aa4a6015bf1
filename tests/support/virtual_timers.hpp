// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_VIRTUAL_TIMERS_HPP
#define SLUICE_TESTS_SUPPORT_VIRTUAL_TIMERS_HPP

// How many virtual timers are pending on a virtual_loop: proves that a timer
// was cancelled at once (a timeout whose operation finished first) or that a
// limiter waits on one timer, not one per waiter.

#include <sluice/detail/virtual_clock.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <cstddef>

namespace sluice_test {

inline std::size_t pending_timers(sluice::testing::virtual_loop& loop) {
  return asio::use_service<sluice::detail::virtual_clock_service>(loop.context()).pending();
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_VIRTUAL_TIMERS_HPP
